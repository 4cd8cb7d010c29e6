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


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_forward_codes_as_uint8(fmt):
    """fp8 q, k, v as uint8 codes (NumPy has no fp8 dtype) with fp8=..., descales, GQA, causal:
    O (float16 by default) and LSE against the float64 semantics, P rounded to e4m3. Nk <= 64
    (one CPU key block: the kernel rounds P against the row's final maximum, as the reference
    does), so the bound is f16's; the same computation without P's rounding is out of it."""
    rng = np.random.default_rng(8)
    top = 0x7E if fmt == "e4m3" else 0x7B  # the largest finite code
    B, Nq, Nk, H, Hkv, D = 2, 21, 48, 4, 2, 32
    codes = [(rng.integers(0, top - 0x30, size=s) | (rng.integers(0, 2, size=s) << 7))
             .astype(np.uint8) for s in ((B, Nq, H, D), (B, Nk, Hkv, D), (B, Nk, Hkv, D))]
    vals = [ref.fp8_values(c, fmt) for c in codes]
    descale = (0.05, 0.5, 0.25) if fmt == "e4m3" else (0.02, 0.5, 0.1)
    o, lse = flashport.attention(*codes, causal=True, return_lse=True, descale=descale, fp8=fmt)
    assert o.dtype == np.float16
    r_o, r_lse = ref.forward_fp8(*vals, descale=descale, causal=True)
    _close(o, r_o, TOL[np.float16], "O")
    _close(lse, r_lse, TOL[np.float32], "LSE")
    unrounded, _ = ref.forward_fp8(*vals, descale=descale, causal=True, round_p=False)
    assert np.abs(o - unrounded).max() > 4 * TOL[np.float16] * np.abs(unrounded).max(), \
        "O does not show P's rounding to e4m3"


def test_fp8_errors():
    """fp8 is forward only; o must be bf16 or f16; an unknown fp8 name is refused."""
    q = np.zeros((1, 4, 2, 8), np.uint8)
    with pytest.raises(flashport.Error) as e:
        flashport.attention(q, q, q, fp8="e3m4")
    assert e.value.status_name == "FLASHPORT_ERR_INVALID_VALUE"
    with pytest.raises(flashport.Error) as e:
        flashport.attention(q, q, q, fp8="e4m3", out=np.empty((1, 4, 2, 8), np.float32))
    assert e.value.status_name == "FLASHPORT_ERR_DTYPE_MISMATCH"
    with pytest.raises(flashport.Error) as e:
        flashport.attention(q, q, q, fp8="e4m3", descale=(1.0, -2.0, 1.0))
    assert e.value.status_name == "FLASHPORT_ERR_INVALID_VALUE" and "descale_k" in str(e.value)
    with pytest.raises(flashport.Error) as e:  # uint8 without fp8=: not an attention dtype
        flashport.attention(q, q, q)
    assert e.value.status_name == "FLASHPORT_ERR_UNSUPPORTED_DTYPE"


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


def test_fp8_paged_kv_cache():
    """fp8 codes (uint8) in a paged cache, descales and seqused_k: the same O and LSE as the dense
    fp8 cache with seqused_k (the paged layout moves no value)."""
    rng = np.random.default_rng(17)
    B, Nq, Nk, H, Hkv, D, ps = 2, 3, 40, 4, 2, 32, 16
    codes = [(rng.integers(0, 0x4E, size=s) | (rng.integers(0, 2, size=s) << 7)).astype(np.uint8)
             for s in ((B, Nq, H, D), (B, Nk, Hkv, D), (B, Nk, Hkv, D))]
    q, k, v = codes
    used = np.array([40, 19], np.int32)
    kw = dict(causal=True, return_lse=True, descale=(0.05, 0.5, 0.25), fp8="e4m3",
              seqused_k=used)
    o, lse = flashport.attention(q, k, v, **kw)
    stride = (Nk + ps - 1) // ps
    table = rng.permutation(B * stride).astype(np.int32).reshape(B, stride)
    kp = np.zeros((B * stride, ps, Hkv, D), np.uint8)
    vp = np.zeros_like(kp)
    for b in range(B):
        for t in range(int(used[b])):
            kp[table[b, t // ps], t % ps] = k[b, t]
            vp[table[b, t // ps], t % ps] = v[b, t]
    op, lp = flashport.attention(q, kp, vp, block_table=table, **kw)
    assert op.dtype == np.float16
    _close(op, np.asarray(o, np.float64), TOL[np.float16], "paged fp8 O")
    _close(lp, np.asarray(lse, np.float64), TOL[np.float32], "paged fp8 LSE")


class _StreamProducer:
    """A DLPack producer that records the stream each export was asked for (a stand-in for
    CuPy, whose frontend hands its arrays to the extension with its current stream)."""

    def __init__(self, a, asked):
        self.a, self.asked = a, asked

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.asked.append(stream)
        return self.a.__dlpack__(max_version=max_version) if max_version else self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


@pytest.mark.parametrize("stream, asked", [(7, 7), (0, 1)])
def test_extension_asks_dlpack_for_the_callers_stream(stream, asked):
    """With a stream, the extension asks every tensor's __dlpack__ for it (0, the legacy default
    stream's handle, is DLPack's 1), inputs, outputs and side arrays alike; the results are
    those of a plain call."""
    from flashport import _C

    rng = np.random.default_rng(9)
    q, k, v, do = (rng.standard_normal((1, 12, 2, 16)).astype(np.float32) for _ in range(4))
    slopes = np.array([0.5, 0.25], np.float32)
    want_o, want_lse = flashport.attention(q, k, v, alibi_slopes=slopes, return_lse=True)
    want = flashport.attention_backward(do, q, k, v, want_o, want_lse, alibi_slopes=slopes)
    seen = []
    o, lse = np.empty_like(q), np.empty((1, 2, 12), np.float32)
    outs = [np.empty_like(x) for x in (q, k, v)]
    wrap = [_StreamProducer(x, seen) for x in (q, k, v, o, lse, do, *outs, slopes)]
    _C.forward("cpu", stream, *wrap[:5], wrap[-1], None, None, 0.0, -1, -1, False, 0.0, 0, 0,
               False, None, None)
    _C.backward("cpu", stream, *wrap[:5], wrap[5], *wrap[6:9], wrap[-1], None, None, 0.0, -1,
                -1, False, 0.0, 0, 0, False, None, None)
    assert seen == [asked] * 16  # forward 5 tensors + slopes, backward 9 + slopes
    assert np.array_equal(o, want_o) and np.array_equal(lse, want_lse)
    for a, b in zip(outs, want):
        assert np.array_equal(a, b)


class _OneBufferNumPy:
    """The frontend of a framework whose outputs are views into one buffer handed to the
    extension by address (CuPy's where it has no exchange API), made of NumPy: it runs that
    path of the package and the extension on the CPU. Records each buffer it allocates."""

    raw = True
    names_stream = False
    allocates = False
    in_one_buffer = True
    fp8 = {}
    float32, uint8 = np.dtype(np.float32), np.dtype(np.uint8)

    def __init__(self):
        self.buffers = []

    def new(self, shape, dtype, like):
        x = np.empty(shape, dtype)
        self.buffers.append(x)
        return x

    def address(self, x):
        return x.__array_interface__["data"][0]

    def view(self, buf, offset, shape, dtype):
        return np.ndarray(shape, dtype, buffer=buf, offset=offset)


@pytest.mark.parametrize("varlen", [False, True])
def test_outputs_in_one_buffer_by_address(monkeypatch, varlen):
    """Outputs written through their addresses into one buffer: bit for bit the results of
    outputs allocated one by one, each a view of the call's one buffer at an aligned offset; o
    alone (no lse) is a buffer of its own."""
    from flashport import _frontends

    rng = np.random.default_rng(11)
    shapes = [(29, 4, 24), (37, 2, 24)] if varlen else [(2, 29, 4, 24), (2, 37, 2, 24)]
    q, do = (rng.standard_normal(shapes[0]).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal(shapes[1]).astype(np.float32) for _ in range(2))
    opts = dict(causal=True, softcap=3.0)
    if varlen:
        opts.update(cu_seqlens_q=np.array([0, 11, 29], np.int32),
                    cu_seqlens_k=np.array([0, 20, 37], np.int32), max_seqlen_q=18,
                    max_seqlen_k=20)
    want_o, want_lse = flashport.attention(q, k, v, return_lse=True, **opts)
    want = flashport.attention_backward(do, q, k, v, want_o, want_lse, **opts)
    fe = _OneBufferNumPy()
    monkeypatch.setitem(_frontends._frontends, np.ndarray, fe)
    o, lse = flashport.attention(q, k, v, return_lse=True, **opts)
    o_alone = flashport.attention(q, k, v, **opts)
    grads = flashport.attention_backward(do, q, k, v, o, lse, **opts)
    assert np.array_equal(o, want_o) and np.array_equal(lse, want_lse)
    assert np.array_equal(o_alone, want_o) and o_alone is fe.buffers[1]
    for got, x, w in zip(grads, (q, k, v), want):
        assert got.shape == x.shape and got.dtype == x.dtype and np.array_equal(got, w)
    assert len(fe.buffers) == 3
    for outs, buf in (((o, lse), fe.buffers[0]), (grads, fe.buffers[2])):
        base = buf.__array_interface__["data"][0]
        offsets = [x.__array_interface__["data"][0] - base for x in outs]
        assert all(x.base is buf for x in outs) and offsets[0] == 0
        assert all(off % 256 == 0 for off in offsets)
        assert offsets[-1] + outs[-1].nbytes <= buf.nbytes


def test_output_address_needs_a_shape():
    """An output given by address whose shape q's rank does not give (lse of a rank-2 q) is
    refused before anything is written."""
    from flashport import _C

    q = np.zeros((16, 8), np.float32)
    room = np.full(64, 7.0, np.float32)
    at = room.__array_interface__["data"][0]
    with pytest.raises(flashport.Error) as e:
        _C.forward("cpu", None, q, q, q, at, at, None, None, None, 0.0, -1, -1, False, 0.0, 0, 0,
                   False, None, None)
    assert e.value.status_name == "FLASHPORT_ERR_SHAPE_MISMATCH"
    assert (room == 7.0).all()


def test_output_layouts_are_bounded(monkeypatch):
    """The table of output layouts (one entry per shapes and dtypes) does not grow past its bound
    however many shapes a program sees (varlen token counts), and stays right past it."""
    from flashport import _api, _frontends

    monkeypatch.setitem(_frontends._frontends, np.ndarray, _OneBufferNumPy())
    monkeypatch.setattr(_api, "_MAX_LAYOUTS", 4)
    monkeypatch.setattr(_api, "_layouts", {})
    rng = np.random.default_rng(12)
    for n in range(3, 13):
        q = rng.standard_normal((1, n, 2, 8)).astype(np.float32)
        o, lse = flashport.attention(q, q, q, return_lse=True)
        ro, rl = ref.forward(q, q, q)
        _close(o, ro, TOL[np.float32], f"o, N = {n}")
        _close(lse, rl, TOL[np.float32], f"lse, N = {n}")
        assert len(_api._layouts) <= 4
