"""flashport on NumPy arrays (CPU backend) against the float64 NumPy reference, every feature,
forward (O, LSE) and backward."""
import numpy as np
import pytest

import flashport
import reference as ref

# max |x - ref| <= TOL * max(1, max |ref|): f32 storage and f16 storage (f32 accumulation in
# both; f16's bound is a few units of its rounding of O and the gradients).
TOL = {np.float32: 2e-5, np.float16: 4e-3}

# (name, B, Nq, Nk, H, Hkv, D, options)
CASES = [
    ("plain", 2, 37, 37, 4, 4, 64, {}),
    ("causal", 1, 50, 50, 2, 2, 32, dict(causal=True)),
    ("causal_nq_lt_nk", 2, 17, 45, 2, 2, 40, dict(causal=True)),
    ("causal_nq_gt_nk_masked_rows", 1, 40, 23, 2, 2, 16, dict(causal=True)),
    ("window", 1, 64, 64, 2, 2, 32, dict(window=(7, 3))),
    ("window_left_causal", 2, 33, 48, 2, 1, 24, dict(causal=True, window=(5, -1))),
    ("softcap", 1, 40, 31, 2, 2, 48, dict(softcap=2.5)),
    ("alibi", 2, 29, 41, 4, 2, 32, dict(alibi=True)),
    ("gqa", 1, 35, 35, 6, 2, 64, {}),
    ("mqa_causal", 1, 24, 40, 8, 1, 32, dict(causal=True)),
    ("scale", 1, 19, 23, 2, 2, 72, dict(scale=0.3)),
    ("odd_head_dim", 1, 21, 26, 3, 3, 13, dict(causal=True, softcap=4.0)),
    ("everything", 2, 31, 47, 4, 2, 80, dict(causal=True, window=(11, -1), softcap=3.0,
                                             alibi=True, scale=0.2)),
]


def _close(x, r, tol, what):
    x = np.asarray(x, np.float64)
    assert x.shape == r.shape, f"{what}: shape {x.shape} != {r.shape}"
    fin = np.isfinite(r)
    assert np.array_equal(np.isfinite(x), fin), f"{what}: non-finite entries differ"
    assert np.array_equal(x[~fin], r[~fin]), f"{what}: infinities differ"
    err = np.abs(x[fin] - r[fin]).max(initial=0.0)
    bound = tol * max(1.0, np.abs(r[fin]).max(initial=0.0))
    assert err <= bound, f"{what}: max abs error {err:.3g} > {bound:.3g}"


def _inputs(rng, B, Nq, Nk, H, Hkv, D, dtype):
    q = rng.standard_normal((B, Nq, H, D)).astype(dtype)
    k = rng.standard_normal((B, Nk, Hkv, D)).astype(dtype)
    v = rng.standard_normal((B, Nk, Hkv, D)).astype(dtype)
    do = rng.standard_normal((B, Nq, H, D)).astype(dtype)
    return q, k, v, do


def _kwargs(opts, H, rng):
    kw = dict(causal=opts.get("causal", False), window=opts.get("window", (-1, -1)),
              softcap=opts.get("softcap", 0.0), scale=opts.get("scale"))
    ref_kw = dict(kw)
    if opts.get("alibi"):
        slopes = (0.5 + rng.random(H)).astype(np.float32) * 0.25
        kw["alibi_slopes"] = slopes
        ref_kw["alibi"] = slopes
    return kw, ref_kw


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_backward(case, dtype):
    name, B, Nq, Nk, H, Hkv, D, opts = case
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    q, k, v, do = _inputs(rng, B, Nq, Nk, H, Hkv, D, dtype)
    kw, ref_kw = _kwargs(opts, H, rng)

    o, lse = flashport.attention(q, k, v, return_lse=True, **kw)
    assert isinstance(o, np.ndarray) and o.dtype == dtype and lse.dtype == np.float32
    ro, rlse = ref.forward(q, k, v, **ref_kw)
    _close(o, ro, TOL[dtype], "o")
    _close(lse, rlse, TOL[dtype], "lse")

    dq, dk, dv = flashport.attention_backward(do, q, k, v, o, lse, **kw)
    assert dq.dtype == dk.dtype == dv.dtype == dtype
    rdq, rdk, rdv = ref.backward(do, q, k, v, **ref_kw)
    for x, r, what in ((dq, rdq, "dq"), (dk, rdk, "dk"), (dv, rdv, "dv")):
        _close(x, r, 2 * TOL[dtype], what)


def test_fully_masked_rows_are_zero_with_lse_minus_inf():
    rng = np.random.default_rng(1)
    q, k, v, _ = _inputs(rng, 1, 12, 4, 1, 1, 16, np.float32)
    o, lse = flashport.attention(q, k, v, causal=True, return_lse=True)
    # Bottom-right causal with Nq = 12, Nk = 4: query rows 0..7 see no key.
    assert np.all(o[0, :8] == 0) and np.all(np.isneginf(lse[0, 0, :8]))
    assert np.all(np.isfinite(lse[0, 0, 8:])) and not np.isnan(o).any()


def test_lse_only_on_request():
    rng = np.random.default_rng(2)
    q, k, v, _ = _inputs(rng, 1, 8, 8, 2, 2, 16, np.float32)
    o = flashport.attention(q, k, v)
    assert isinstance(o, np.ndarray)
    o2, lse = flashport.attention(q, k, v, return_lse=True)
    np.testing.assert_array_equal(o, o2)
    assert lse.shape == (1, 2, 8)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_strided_inputs(dtype):
    """Views with arbitrary strides (heads-major storage, a sliced head dim) are read in place."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal((3, 2, 4, 30, 40)).astype(dtype)  # [3, B, H, N, D + pad]
    q, k, v = (base[i].transpose(0, 2, 1, 3)[..., :32] for i in range(3))
    assert not q.flags.c_contiguous
    o, lse = flashport.attention(q, k, v, causal=True, return_lse=True)
    ro, rlse = ref.forward(q, k, v, causal=True)
    _close(o, ro, TOL[dtype], "o")
    do = rng.standard_normal(o.shape).astype(dtype)
    grads = flashport.attention_backward(do, q, k, v, o, lse, causal=True)
    for x, r in zip(grads, ref.backward(do, q, k, v, causal=True)):
        assert x.shape == r.shape
        _close(x, r, 2 * TOL[dtype], "grad")


@pytest.mark.parametrize("opts", [{}, dict(causal=True), dict(window=(4, 2), softcap=3.0)],
                         ids=["plain", "causal", "window_softcap"])
def test_varlen(opts):
    rng = np.random.default_rng(4)
    lens_q, lens_k = [5, 0, 17, 9], [7, 3, 17, 30]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    H, Hkv, D = 4, 2, 24
    q = rng.standard_normal((cu_q[-1], H, D)).astype(np.float32)
    k = rng.standard_normal((cu_k[-1], Hkv, D)).astype(np.float32)
    v = rng.standard_normal((cu_k[-1], Hkv, D)).astype(np.float32)
    do = rng.standard_normal(q.shape).astype(np.float32)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **opts)
    o, lse = flashport.attention(q, k, v, return_lse=True, **kw)
    assert lse.shape == (H, cu_q[-1])
    ro, rlse = ref.varlen_forward(q, k, v, cu_q, cu_k, **opts)
    _close(o, ro, TOL[np.float32], "o")
    _close(lse, rlse, TOL[np.float32], "lse")
    # max_seqlen given explicitly gives the same result as read from cu_seqlens.
    o2 = flashport.attention(q, k, v, max_seqlen_q=17, max_seqlen_k=30, **kw)
    np.testing.assert_array_equal(o, o2)
    grads = flashport.attention_backward(do, q, k, v, o, lse, **kw)
    for x, r, what in zip(grads, ref.varlen_backward(do, q, k, v, cu_q, cu_k, **opts),
                          ("dq", "dk", "dv")):
        _close(x, r, 2 * TOL[np.float32], what)


def test_deterministic_backward_is_bitwise_repeatable():
    rng = np.random.default_rng(5)
    q, k, v, do = _inputs(rng, 2, 70, 70, 4, 2, 64, np.float32)
    o, lse = flashport.attention(q, k, v, causal=True, return_lse=True)
    runs = [flashport.attention_backward(do, q, k, v, o, lse, causal=True, deterministic=True)
            for _ in range(3)]
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            np.testing.assert_array_equal(a, b)


def test_reference_backend_agrees():
    rng = np.random.default_rng(6)
    q, k, v, _ = _inputs(rng, 1, 20, 20, 2, 2, 32, np.float32)
    o_cpu = flashport.attention(q, k, v, causal=True)
    o_ref = flashport.attention(q, k, v, causal=True, backend="reference")
    _close(o_cpu, np.asarray(o_ref, np.float64), TOL[np.float32], "o")


def test_read_only_inputs():
    rng = np.random.default_rng(7)
    q, k, v, _ = _inputs(rng, 1, 9, 9, 1, 1, 8, np.float32)
    for x in (q, k, v):
        x.flags.writeable = False
    o = flashport.attention(q, k, v)
    _close(o, ref.forward(q, k, v)[0], TOL[np.float32], "o")


def test_package_ships_its_library():
    import os

    lib = flashport.library_path()
    assert os.path.dirname(lib) == os.path.dirname(flashport.__file__)
    assert "cpu" in flashport.available_backends()
    assert flashport.version() == flashport.__version__


def test_kv_cache_seqused_and_paged():
    """seqused_k on a dense cache equals attention over each sequence's used keys alone; a paged
    cache with shuffled pages (the unused rows NaN) gives the same O and LSE; its backward is
    refused."""
    rng = np.random.default_rng(18)
    B, Nq, Nk, H, Hkv, D, ps = 3, 4, 70, 8, 2, 32, 16
    q, k, v, _ = _inputs(rng, B, Nq, Nk, H, Hkv, D, np.float32)
    used = np.array([70, 23, 0], np.int32)
    o, lse = flashport.attention(q, k, v, causal=True, return_lse=True, seqused_k=used)
    for b in range(B):
        n = int(used[b])
        ob, lb = flashport.attention(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], causal=True,
                                     return_lse=True)
        _close(o[b:b + 1], np.asarray(ob, np.float64), TOL[np.float32], f"O of sequence {b}")
        _close(lse[b:b + 1], np.asarray(lb, np.float64), TOL[np.float32], f"LSE of sequence {b}")
    stride = (Nk + ps - 1) // ps
    pages = rng.permutation(B * stride).astype(np.int32)
    table = pages.reshape(B, stride)
    kp = np.full((B * stride, ps, Hkv, D), np.nan, np.float32)
    vp = np.full_like(kp, np.nan)
    for b in range(B):
        for t in range(int(used[b])):
            kp[table[b, t // ps], t % ps] = k[b, t]
            vp[table[b, t // ps], t % ps] = v[b, t]
    op, lp = flashport.attention(q, kp, vp, causal=True, return_lse=True, seqused_k=used,
                                 block_table=table)
    _close(op, np.asarray(o, np.float64), TOL[np.float32], "paged O")
    _close(lp, np.asarray(lse, np.float64), TOL[np.float32], "paged LSE")
    with pytest.raises(flashport.Error, match="FLASHPORT_ERR_BAD_SEQLENS"):
        flashport.attention(q, k, v, seqused_k=np.array([71, 0, 0], np.int32))
    with pytest.raises(flashport.Error, match="FLASHPORT_ERR_SHAPE_MISMATCH"):
        flashport.attention(q, kp, vp, seqused_k=used, block_table=table[:2])
