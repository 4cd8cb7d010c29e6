"""CUDA specifics: the package's CUDA plugin opens where torch sees a GPU, work goes on the
caller's stream, CuPy arrays in and out. Skipped (never passed) without a CUDA device; the
shared suites (test_torch.py) run their cuda cases there too."""
import numpy as np
import pytest

import flashport
import reference as ref

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)


def test_cuda_backend_ships_and_opens():
    assert "cuda" in flashport.available_backends(), (
        f"a GPU is visible but the package's cuda backend does not open "
        f"(library: {flashport.library_path()}; was the wheel built with FLASHPORT_CUDA=OFF?)")


def test_f32_is_refused_on_cuda():
    q = torch.randn(1, 16, 2, 64, device="cuda")
    with pytest.raises(flashport.Error) as e:
        flashport.attention(q, q, q)
    assert e.value.status_name == "FLASHPORT_ERR_UNSUPPORTED_DTYPE"


def test_host_data_on_cuda_backend_is_refused():
    q = torch.randn(1, 16, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(flashport.Error) as e:
        flashport.attention(q, q, q, backend="cuda")
    assert e.value.status_name == "FLASHPORT_ERR_INVALID_VALUE"


def test_mixed_devices_are_refused():
    q = torch.randn(1, 16, 2, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(flashport.Error) as e:
        flashport.attention(q, q.cpu(), q)
    assert e.value.status_name == "FLASHPORT_ERR_INVALID_VALUE"


def test_runs_on_the_current_stream():
    """A side stream that is busy when the call is made: the result is right once that stream is
    waited for, i.e. flashport's kernels were ordered after the stream's earlier work."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(4, 512, 8, 128, generator=g).to("cuda", torch.bfloat16)
               for _ in range(3))
    expected = flashport.attention(q, k, v, causal=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())  # q, k, v were made on the default stream
    with torch.cuda.stream(s):
        qs = torch.zeros_like(q)
        big = torch.randn(8192, 8192, device="cuda")
        for _ in range(4):
            big = big @ big / 8192  # keep the stream busy
        qs.copy_(q)
        o = flashport.attention(qs, k, v, causal=True)
    s.synchronize()
    torch.testing.assert_close(o, expected, rtol=0, atol=0)


def test_cupy_in_and_out():
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 40, 4, 64)).astype(np.float16) for _ in range(3))
    o, lse = flashport.attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), causal=True,
                                 return_lse=True)
    assert isinstance(o, cp.ndarray) and o.dtype == cp.float16 and lse.dtype == cp.float32
    ro, _ = ref.forward(q, k, v, causal=True)
    assert np.abs(cp.asnumpy(o).astype(np.float64) - ro).max() <= 4e-3 * max(1, np.abs(ro).max())


def test_cupy_outputs_in_one_buffer():
    """CuPy outputs (o alone, o and lse, dq, dk, dv): CuPy arrays on q's device with q's, k's
    and v's shapes and dtypes, right against the reference; where CuPy has no exchange API a
    call's outputs share one allocation (views of one buffer)."""
    cp = pytest.importorskip("cupy")
    from flashport import _frontends

    rng = np.random.default_rng(3)
    q, do = (rng.standard_normal((2, 33, 4, 64)).astype(np.float16) for _ in range(2))
    k, v = (rng.standard_normal((2, 47, 2, 64)).astype(np.float16) for _ in range(2))
    cq, ck, cv, cdo = (cp.asarray(x) for x in (q, k, v, do))
    o_alone = flashport.attention(cq, ck, cv, causal=True)
    o, lse = flashport.attention(cq, ck, cv, causal=True, return_lse=True)
    grads = flashport.attention_backward(cdo, cq, ck, cv, o, lse, causal=True)
    cp.cuda.get_current_stream().synchronize()
    ro, _ = ref.forward(q, k, v, causal=True)
    bound = 4e-3 * max(1, np.abs(ro).max())
    assert np.abs(cp.asnumpy(o_alone).astype(np.float64) - ro).max() <= bound
    assert cp.array_equal(o, o_alone)
    for got, x, r in zip(grads, (q, k, v), ref.backward(do, q, k, v, causal=True)):
        assert isinstance(got, cp.ndarray) and got.shape == x.shape and got.dtype == x.dtype
        assert got.device == cq.device
        assert np.abs(cp.asnumpy(got).astype(np.float64) - r).max() <= 2e-2 * max(
            1, np.abs(r).max())
    if _frontends.frontend(cq).in_one_buffer:  # the views' memory is one allocation
        assert o.data.mem is lse.data.mem
        assert all(g.data.mem is grads[0].data.mem for g in grads)
