"""Bad input raises flashport.Error with the right status and a message, never a crash."""
import numpy as np
import pytest

import flashport


def _qkv(B=1, Nq=8, Nk=8, H=2, Hkv=2, D=16, dtype=np.float32):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((B, Nq, H, D)).astype(dtype),
            rng.standard_normal((B, Nk, Hkv, D)).astype(dtype),
            rng.standard_normal((B, Nk, Hkv, D)).astype(dtype))


def _raises(status, fn, *args, **kw):
    with pytest.raises(flashport.Error) as info:
        fn(*args, **kw)
    e = info.value
    assert e.status_name == status, f"{e.status_name}: {e.message}"
    assert e.message and str(e).startswith(status)
    return e


def test_head_ratio():
    q, k, v = _qkv(H=6, Hkv=4)
    e = _raises("FLASHPORT_ERR_HEAD_RATIO", flashport.attention, q, k, v)
    assert e.status == 5


def test_shape_mismatch():
    q, k, v = _qkv()
    _raises("FLASHPORT_ERR_SHAPE_MISMATCH", flashport.attention, q, k, v[:, :5])
    _raises("FLASHPORT_ERR_SHAPE_MISMATCH", flashport.attention, q, k[..., :8], v)


def test_dtype_mismatch():
    q, k, v = _qkv()
    _raises("FLASHPORT_ERR_DTYPE_MISMATCH", flashport.attention, q, k.astype(np.float16), v)


def test_unsupported_dtype():
    q, k, v = _qkv(dtype=np.float64)
    e = _raises("FLASHPORT_ERR_UNSUPPORTED_DTYPE", flashport.attention, q, k, v)
    assert "float64" in e.message
    q, k, v = _qkv()
    _raises("FLASHPORT_ERR_UNSUPPORTED_DTYPE", flashport.attention, q.astype(np.int32),
            k.astype(np.int32), v.astype(np.int32))


def test_unsupported_head_dim():
    q, k, v = _qkv(D=300)
    _raises("FLASHPORT_ERR_UNSUPPORTED_HEAD_DIM", flashport.attention, q, k, v)


def test_invalid_values():
    q, k, v = _qkv()
    _raises("FLASHPORT_ERR_INVALID_VALUE", flashport.attention, q, k, v, window=(-2, 0))
    _raises("FLASHPORT_ERR_INVALID_VALUE", flashport.attention, q, k, v, softcap=-1.0)
    _raises("FLASHPORT_ERR_INVALID_VALUE", flashport.attention, q, k, v, scale=-0.5)
    _raises("FLASHPORT_ERR_INVALID_VALUE", flashport.attention, q, k, v, window=(2**40, 0))


def test_wrong_rank():
    q, k, v = _qkv()
    _raises("FLASHPORT_ERR_SHAPE_MISMATCH", flashport.attention, q[0, 0], k[0, 0], v[0, 0])
    _raises("FLASHPORT_ERR_SHAPE_MISMATCH", flashport.attention, q[None], k[None], v[None])


def test_not_a_tensor():
    q, k, v = _qkv()
    _raises("FLASHPORT_ERR_INVALID_VALUE", flashport.attention, q, k.tolist(), v)
    _raises("FLASHPORT_ERR_INVALID_VALUE", flashport.attention, q.tolist(), k, v)


def test_backends():
    q, k, v = _qkv()
    e = _raises("FLASHPORT_ERR_BACKEND_UNKNOWN", flashport.attention, q, k, v, backend="nope")
    assert "cpu" in e.message  # names the available backends
    # Host memory on a GPU backend would be a wild pointer: refused before any backend opens.
    _raises("FLASHPORT_ERR_INVALID_VALUE", flashport.attention, q, k, v, backend="cuda")
    _raises("FLASHPORT_ERR_INVALID_VALUE", flashport.attention, q, k, v, backend="hip")


def test_alibi_slopes():
    q, k, v = _qkv(H=4, Hkv=2)
    _raises("FLASHPORT_ERR_SHAPE_MISMATCH", flashport.attention, q, k, v,
            alibi_slopes=np.ones(3, np.float32))
    _raises("FLASHPORT_ERR_DTYPE_MISMATCH", flashport.attention, q, k, v,
            alibi_slopes=np.ones(4, np.float64))
    _raises("FLASHPORT_ERR_UNSUPPORTED_LAYOUT", flashport.attention, q, k, v,
            alibi_slopes=np.ones(8, np.float32)[::2])


def _varlen():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((12, 2, 16)).astype(np.float32)
    k = rng.standard_normal((12, 2, 16)).astype(np.float32)
    return q, k, k.copy()


def test_bad_seqlens():
    q, k, v = _varlen()
    good = np.array([0, 5, 12], np.int32)
    _raises("FLASHPORT_ERR_BAD_SEQLENS", flashport.attention, q, k, v,
            cu_seqlens_q=np.array([0, 7, 5], np.int32), cu_seqlens_k=good, max_seqlen_q=7,
            max_seqlen_k=7)
    _raises("FLASHPORT_ERR_BAD_SEQLENS", flashport.attention, q, k, v,
            cu_seqlens_q=np.array([0, 5, 13], np.int32), cu_seqlens_k=good, max_seqlen_q=8,
            max_seqlen_k=7)
    _raises("FLASHPORT_ERR_BAD_SEQLENS", flashport.attention, q, k, v, cu_seqlens_q=good,
            cu_seqlens_k=np.array([0, 12], np.int32))
    _raises("FLASHPORT_ERR_DTYPE_MISMATCH", flashport.attention, q, k, v,
            cu_seqlens_q=good.astype(np.int64), cu_seqlens_k=good)
    _raises("FLASHPORT_ERR_BAD_SEQLENS", flashport.attention, q, k, v, cu_seqlens_q=good,
            cu_seqlens_k=good, max_seqlen_q=3, max_seqlen_k=7)


def test_backward_shape_mismatch():
    q, k, v = _qkv()
    o, lse = flashport.attention(q, k, v, return_lse=True)
    _raises("FLASHPORT_ERR_SHAPE_MISMATCH", flashport.attention_backward, o[:, :4], q, k, v, o,
            lse)
    _raises("FLASHPORT_ERR_SHAPE_MISMATCH", flashport.attention_backward, o, q, k, v, o,
            lse[:, :1])
    _raises("FLASHPORT_ERR_DTYPE_MISMATCH", flashport.attention_backward, o, q, k, v, o,
            lse.astype(np.float16))


def test_error_is_an_exception_with_fields():
    q, k, v = _qkv(H=3, Hkv=2)
    try:
        flashport.attention(q, k, v)
    except Exception as e:  # noqa: BLE001 - what a caller who knows nothing of flashport sees
        assert isinstance(e, flashport.Error)
        assert (e.status, e.status_name) == (5, "FLASHPORT_ERR_HEAD_RATIO")
        assert "3" in e.message and "2" in e.message
    else:
        pytest.fail("no error")
