"""flashport.torch on torch tensors, CPU and CUDA: forward and autograd backward against torch's
own math SDPA, the flash_attn-compatible wrappers, torch.compile and the op checks.

Every test runs on "cpu" and on "cuda"; without a CUDA device the cuda ones are skipped. A
result is accepted when its error (against a float64 computation) is within twice the error of
torch's math SDPA computed in the same dtype, plus a floor of a few units of the dtype's rounding.
"""
import contextlib
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import flashport  # noqa: E402
import flashport.torch as ft  # noqa: E402
import reference as ref  # noqa: E402

FLOOR = {torch.float32: 2e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _devices():
    return [pytest.param("cpu", id="cpu"),
            pytest.param("cuda", id="cuda")]


@pytest.fixture(params=_devices())
def device(request):
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return request.param


def _dtypes(device):
    # The CUDA backend serves f16 and bf16; the CPU backend f32, f16 and bf16.
    return [torch.float32, torch.bfloat16] if device == "cpu" else [torch.bfloat16, torch.float16]


def _visible(Nq, Nk, causal, window):
    i = torch.arange(Nq)[:, None] + (Nk - Nq)
    j = torch.arange(Nk)[None, :]
    left, right = window
    if causal:
        right = 0
    vis = torch.ones(Nq, Nk, dtype=torch.bool)
    if left >= 0:
        vis &= j >= i - left
    if right >= 0:
        vis &= j <= i + right
    return vis


def _sdpa(q, k, v, causal=False, window=(-1, -1), alibi=None, scale=None, dtype=None):
    """torch's math SDPA in our layout [B, N, H, D], bottom-right aligned masks, ALiBi as an
    additive mask; computed in `dtype` (default: the inputs')."""
    Nq, Nk, H = q.shape[1], k.shape[1], q.shape[2]
    dtype = dtype or q.dtype
    vis = _visible(Nq, Nk, causal, window).to(q.device)
    mask = torch.zeros(Nq, Nk, dtype=dtype, device=q.device).masked_fill(~vis, float("-inf"))
    mask = mask.expand(1, H, Nq, Nk)
    if alibi is not None:
        i = torch.arange(Nq, device=q.device)[:, None] + (Nk - Nq)
        j = torch.arange(Nk, device=q.device)[None, :]
        mask = mask - (alibi.to(dtype)[:, None, None] * (i - j).abs().to(dtype))[None]
    with sdpa_kernel([SDPBackend.MATH]):
        o = F.scaled_dot_product_attention(
            q.to(dtype).transpose(1, 2), k.to(dtype).transpose(1, 2),
            v.to(dtype).transpose(1, 2), attn_mask=mask, scale=scale,
            enable_gqa=q.shape[2] != k.shape[2])
    return o.transpose(1, 2)


def _err(x, truth):
    x, truth = x.detach().double().cpu(), truth.detach().double().cpu()
    return ((x - truth).abs().max() / truth.abs().max().clamp_min(1.0)).item()


def _check(ours, same_prec, truth, dtype, what):
    e, base = _err(ours, truth), _err(same_prec, truth)
    bound = 2 * base + FLOOR[dtype]
    assert not torch.isnan(ours).any(), f"{what}: NaN"
    assert e <= bound, f"{what}: error {e:.3g} > {bound:.3g} (torch math SDPA: {base:.3g})"


CASES = [
    ("plain", 2, 64, 64, 4, 4, 64, {}),
    ("causal", 1, 77, 77, 4, 4, 128, dict(causal=True)),
    ("causal_nq_lt_nk", 2, 33, 90, 2, 2, 64, dict(causal=True)),
    ("window", 1, 96, 96, 2, 2, 64, dict(window=(16, 8))),
    ("gqa_causal", 1, 65, 65, 8, 2, 64, dict(causal=True)),
    ("mqa", 2, 40, 56, 4, 1, 96, {}),
    ("alibi", 1, 50, 70, 4, 4, 32, dict(alibi=True)),
    ("scale_d80", 1, 45, 45, 2, 2, 80, dict(scale=0.05)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dt", [0, 1], ids=["dtype0", "dtype1"])
def test_forward_backward_vs_sdpa(device, case, dt):
    name, B, Nq, Nk, H, Hkv, D, opts = case
    dtype = _dtypes(device)[dt]
    g = torch.Generator().manual_seed(hash(name) % 2**31)
    mk = lambda *s: torch.randn(*s, generator=g).to(device, dtype)  # noqa: E731
    q, k, v, do = mk(B, Nq, H, D), mk(B, Nk, Hkv, D), mk(B, Nk, Hkv, D), mk(B, Nq, H, D)
    alibi = (torch.rand(H, generator=g) * 0.3 + 0.05).to(device) if opts.get("alibi") else None
    kw = dict(causal=opts.get("causal", False), window=opts.get("window", (-1, -1)),
              scale=opts.get("scale"))

    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    o = ft.attention(*leaves, alibi_slopes=alibi, **kw)
    assert o.dtype == dtype and o.device.type == device and o.shape == q.shape
    o.backward(do)

    def grads_of(dtype_):
        xs = [x.detach().to(dtype_).requires_grad_(True) for x in (q, k, v)]
        out = _sdpa(*xs, alibi=alibi, dtype=dtype_, **kw)
        out.backward(do.to(dtype_))
        return out, [x.grad for x in xs]

    truth_o, truth_g = grads_of(torch.float64) if device == "cpu" else _cpu64(q, k, v, do,
                                                                               alibi, kw)
    same_o, same_g = grads_of(dtype)
    _check(o, same_o, truth_o, dtype, "o")
    for x, s, t, what in zip(leaves, same_g, truth_g, ("dq", "dk", "dv")):
        assert x.grad.dtype == dtype
        _check(x.grad, s, t, dtype, what)


def _cpu64(q, k, v, do, alibi, kw):
    xs = [x.detach().cpu().double().requires_grad_(True) for x in (q, k, v)]
    out = _sdpa(*xs, alibi=None if alibi is None else alibi.cpu(), dtype=torch.float64, **kw)
    out.backward(do.cpu().double())
    return out, [x.grad for x in xs]


def test_softcap_and_lse_vs_reference(device):
    """Softcap is not in SDPA: against the NumPy float64 reference, with LSE."""
    dtype = _dtypes(device)[-1]
    g = torch.Generator().manual_seed(11)
    q, k, v, do = (torch.randn(*s, generator=g).to(device, dtype)
                   for s in ((2, 40, 4, 64), (2, 52, 2, 64), (2, 52, 2, 64), (2, 40, 4, 64)))
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    o, lse = ft.attention(*leaves, causal=True, softcap=3.0, return_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, 40) and not lse.requires_grad
    o.backward(do)
    np_ = lambda t: t.detach().float().cpu().numpy()  # noqa: E731
    ro, rlse = ref.forward(np_(q), np_(k), np_(v), causal=True, softcap=3.0)
    tol = 4 * FLOOR[dtype]
    assert np.abs(np_(o) - ro).max() <= tol * max(1, np.abs(ro).max())
    assert np.abs(np_(lse) - rlse).max() <= tol * max(1, np.abs(rlse).max())
    rg = ref.backward(np_(do), np_(q), np_(k), np_(v), causal=True, softcap=3.0)
    for x, r in zip(leaves, rg):
        assert np.abs(np_(x.grad) - r).max() <= 2 * tol * max(1, np.abs(r).max())


def test_varlen_wrapper_vs_per_sequence_sdpa(device):
    dtype = _dtypes(device)[0]
    lens_q, lens_k = [9, 30, 1, 17], [20, 30, 12, 40]
    H, Hkv, D = 4, 2, 64
    cu_q = torch.tensor([0] + np.cumsum(lens_q).tolist(), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + np.cumsum(lens_k).tolist(), dtype=torch.int32, device=device)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(sum(lens_q), H, D, generator=g).to(device, dtype).requires_grad_(True)
    k = torch.randn(sum(lens_k), Hkv, D, generator=g).to(device, dtype).requires_grad_(True)
    v = torch.randn(sum(lens_k), Hkv, D, generator=g).to(device, dtype).requires_grad_(True)
    o, lse, s = ft.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                          causal=True, return_attn_probs=True)
    assert s is None and lse.shape == (H, sum(lens_q))
    o.sum().backward()  # a stride-0 output gradient
    qd, kd, vd = (x.detach().double().cpu().requires_grad_(True) for x in (q, k, v))
    outs = []
    for b in range(4):
        sq = slice(int(cu_q[b]), int(cu_q[b + 1]))
        sk = slice(int(cu_k[b]), int(cu_k[b + 1]))
        outs.append(_sdpa(qd[None, sq], kd[None, sk], vd[None, sk], causal=True)[0])
    ro = torch.cat(outs)
    ro.sum().backward()
    tol = 4 * FLOOR[dtype]
    assert _err(o, ro) <= tol
    for x, r in ((q, qd), (k, kd), (v, vd)):
        assert _err(x.grad, r.grad) <= 2 * tol


def test_flash_attn_wrappers(device):
    dtype = _dtypes(device)[-1]
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(2, 48, 3, 4, 64, generator=g).to(device, dtype).requires_grad_(True)
    o = ft.flash_attn_qkvpacked_func(qkv, causal=True)
    q, k, v = (qkv.detach()[:, :, i] for i in range(3))
    o2, lse, none = ft.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert none is None and lse.shape == (2, 4, 48)
    torch.testing.assert_close(o, o2, rtol=0, atol=0)
    o.float().square().sum().backward()
    assert qkv.grad.shape == qkv.shape and torch.isfinite(qkv.grad).all()
    assert qkv.grad.abs().sum() > 0

    kv = torch.stack([k, v], dim=2)
    o3 = ft.flash_attn_kvpacked_func(q, kv, causal=True, softmax_scale=1 / math.sqrt(64))
    torch.testing.assert_close(o3, o2, rtol=0, atol=0)

    with pytest.raises(flashport.Error) as e:
        ft.flash_attn_func(q, k, v, dropout_p=0.1)
    assert e.value.status_name == "FLASHPORT_ERR_UNSUPPORTED_FEATURE"
    with pytest.raises(flashport.Error) as e:
        ft.flash_attn_varlen_func(q[0], k[0], v[0], None, None, 48, 48,
                                  block_table=torch.zeros(1, 1, dtype=torch.int32))
    assert e.value.status_name == "FLASHPORT_ERR_UNSUPPORTED_FEATURE"


def test_plain_api_returns_torch(device):
    dtype = _dtypes(device)[-1]
    q = torch.randn(1, 16, 2, 32, device=device, dtype=dtype, requires_grad=True)
    o, lse = flashport.attention(q, q, q, return_lse=True)
    assert isinstance(o, torch.Tensor) and o.device == q.device and o.dtype == dtype
    assert lse.dtype == torch.float32 and not o.requires_grad
    dq, dk, dv = flashport.attention_backward(o, q, q, q, o, lse)
    assert all(isinstance(x, torch.Tensor) and x.device == q.device for x in (dq, dk, dv))


def test_deterministic_backward(device):
    dtype = _dtypes(device)[-1]
    g = torch.Generator().manual_seed(9)
    q, k, v, do = (torch.randn(2, 130, 4, 64, generator=g).to(device, dtype) for _ in range(4))
    runs = []
    for _ in range(3):
        xs = [x.clone().requires_grad_(True) for x in (q, k, v)]
        ft.attention(*xs, causal=True, deterministic=True).backward(do)
        runs.append([x.grad for x in xs])
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert torch.equal(a, b)


def test_torch_compile(device):
    dtype = _dtypes(device)[-1]
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 40, 4, 64, generator=g).to(device, dtype) for _ in range(3))

    def f(q, k, v):
        return ft.flash_attn_func(q, k, v, causal=True).float().square().sum()

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    grads = []
    for fn in (f, compiled):
        xs = [x.clone().requires_grad_(True) for x in (q, k, v)]
        loss = fn(*xs)
        loss.backward()
        grads.append((loss.detach(), [x.grad for x in xs]))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=0, atol=0)
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_opcheck(device):
    from torch.library import opcheck

    dtype = _dtypes(device)[-1]
    q = torch.randn(1, 24, 4, 32, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(1, 30, 2, 32, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(1, 30, 2, 32, device=device, dtype=dtype, requires_grad=True)
    args = (q, k, v, None, None, None, 0.0, -1, 0, True, 0.0, 0, 0, False)
    opcheck(torch.ops.flashport.attention_forward.default, args)
    o, lse = torch.ops.flashport.attention_forward(*args)
    bargs = (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o.detach(), lse) + \
        args[3:]
    opcheck(torch.ops.flashport.attention_backward.default, bargs)


def test_errors_through_torch(device):
    dtype = _dtypes(device)[-1]
    q = torch.randn(1, 8, 3, 32, device=device, dtype=dtype)
    k = torch.randn(1, 8, 2, 32, device=device, dtype=dtype)
    with pytest.raises(flashport.Error) as e:
        ft.attention(q, k, k)
    assert e.value.status_name == "FLASHPORT_ERR_HEAD_RATIO"
    with pytest.raises(flashport.Error) as e:
        flashport.attention(q.double(), q.double(), q.double())
    assert e.value.status_name == "FLASHPORT_ERR_UNSUPPORTED_DTYPE"


def test_fp8_forward(device):
    """torch float8_e4m3fn q, k, v (exported as uint8 views, the format named by their dtype) with
    descales: o in bfloat16 against the float64 fp8 semantics of tests/reference.py, Nk <= 64
    (the CPU kernel then rounds P against the row's final maximum, as the semantics do); the
    backward is refused. The CUDA backend serves it on compute capability 9.0 (its sm90 kernels:
    hardware exp2 and log2, so the LSE within 1e-4) and must refuse it elsewhere."""
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8 dtypes")
    g = torch.Generator().manual_seed(8)
    q8, k8, v8 = (torch.randn(1, 20, 2, 32, generator=g).to(torch.float8_e4m3fn).to(device)
                  for _ in range(3))
    descale = (0.5, 0.25, 2.0)
    if device == "cuda" and torch.cuda.get_device_capability() != (9, 0):
        with pytest.raises(flashport.Error) as e:
            flashport.attention(q8, k8, v8, descale=descale)
        assert e.value.status_name == "FLASHPORT_ERR_UNSUPPORTED_DTYPE"
        return
    o, lse = flashport.attention(q8, k8, v8, causal=True, return_lse=True, descale=descale)
    assert o.dtype == torch.bfloat16 and o.shape == q8.shape
    vals = [ref.fp8_values(x.view(torch.uint8).cpu().numpy(), "e4m3") for x in (q8, k8, v8)]
    r_o, r_lse = ref.forward_fp8(*vals, descale=descale, causal=True)
    err = np.abs(o.float().cpu().numpy() - r_o).max()
    assert err <= FLOOR[torch.bfloat16] * max(1.0, np.abs(r_o).max()), err
    tol = 1e-4 if device == "cuda" else 1e-5
    assert np.allclose(lse.cpu().numpy(), r_lse, rtol=tol, atol=tol)
    with pytest.raises(flashport.Error) as e:
        flashport.attention_backward(o, q8, k8, v8, o, lse)
    assert e.value.status_name == "FLASHPORT_ERR_UNSUPPORTED_DTYPE"


def _run_attention(q, k, v, do, **kw):
    xs = [x.clone().requires_grad_(True) for x in (q, k, v)]
    o, lse = ft.attention(*xs, return_lse=True, **kw)
    o.backward(do)
    return o, lse, [x.grad for x in xs]


class _SeenOps(TorchDispatchMode):
    """Records the ops dispatched under it (and so routes flashport.torch through its op)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.name())
        return func(*args, **(kwargs or {}))


def test_eager_calls_skip_the_op_and_agree_with_it(device):
    """A plain eager call runs the extension directly (torch.autograd.Function when a gradient is
    wanted, nothing around it otherwise); under a dispatch mode the forward and the backward go
    through the ops, which the mode sees. All give the same o, lse and gradients, bit for bit."""
    dtype = _dtypes(device)[-1]
    g = torch.Generator().manual_seed(11)
    q, k, v, do = (torch.randn(2, 37, 4, 32, generator=g).to(device, dtype) for _ in range(4))
    o, lse, grads = _run_attention(q, k, v, do, causal=True)
    assert type(o.grad_fn).__name__ == "_AttentionBackward"  # the eager autograd.Function
    seen = _SeenOps()
    with seen:
        xs = [x.clone().requires_grad_(True) for x in (q, k, v)]
        o2, lse2 = ft.attention(*xs, causal=True, return_lse=True)
        o2.backward(do)
    assert seen.ops.count("flashport::attention_forward") == 1
    assert seen.ops.count("flashport::attention_backward") == 1
    with torch.no_grad():
        o3, lse3 = ft.attention(q, k, v, causal=True, return_lse=True)
    assert o3.grad_fn is None and not o3.requires_grad
    # The op called as such on plain tensors: its autograd kernel runs the implementation itself.
    xs4 = [x.clone().requires_grad_(True) for x in (q, k, v)]
    o4, lse4 = torch.ops.flashport.attention_forward(*xs4, None, None, None, 0.0, -1, -1, True,
                                                     0.0, 0, 0, False)
    o4.backward(do)
    for a, b, c, d in ((o, o2, o3, o4), (lse, lse2, lse3, lse4)):
        assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d)
    for a, x, y in zip(grads, xs, xs4):
        assert torch.equal(a, x.grad) and torch.equal(a, y.grad)


def test_torch_without_the_exchange_api(device, monkeypatch):
    """A torch without the DLPack C exchange API (torch.Tensor.__dlpack_c_exchange_api__): the
    package then allocates the outputs in Python and hands tensors over as DLPack capsules
    (torch._C._to_dlpack). Forced here: the same results, bit for bit, as through the exchange
    API, for strided inputs, the autograd path, the out= path, and (CPU) seqused_k, block_table
    and fp8."""
    from flashport._frontends import frontend

    dtype = _dtypes(device)[-1]
    g = torch.Generator().manual_seed(12)
    qkv = torch.randn(1, 29, 3, 2, 64, generator=g).to(device, dtype)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # strided views
    do = torch.randn(1, 29, 2, 64, generator=g).to(device, dtype)
    fe = frontend(q)

    def run():
        o, lse, grads = _run_attention(q, k, v, do, window=(5, 3))
        plain = flashport.attention_backward(do, q, k, v, o.detach(), lse, window=(5, 3))
        outs = [torch.empty_like(x) for x in (q, k, v)]
        flashport.attention_backward(do, q, k, v, o.detach(), lse, window=(5, 3), out=outs)
        res = [o, lse, *grads, *plain, *outs]
        if device != "cpu":
            return res
        used = torch.tensor([20], dtype=torch.int32)
        table = torch.zeros(1, 1, dtype=torch.int32)  # the strided k, v as one page of 29 rows
        res += [flashport.attention(q, k, v, causal=True, seqused_k=used, block_table=bt)
                for bt in (None, table)]
        if hasattr(torch, "float8_e4m3fn"):
            q8 = q.to(torch.float8_e4m3fn)
            o8 = flashport.attention(q8, q8, q8, descale=(0.5, 0.5, 2.0))
            assert o8.dtype == torch.bfloat16
            res.append(o8)
        return res

    if not (fe.raw and fe.allocates):
        pytest.skip("this torch has no DLPack exchange API: every other test runs its path")
    fast = run()
    monkeypatch.setattr(fe, "raw", False)
    monkeypatch.setattr(fe, "allocates", False)
    slow = run()
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_parameters(device):
    """torch.nn.Parameter (a torch.Tensor subclass that requires grad) as q, k, v: through the
    plain API and through the custom op with autograd, the same as plain tensors."""
    dtype = _dtypes(device)[-1]
    g = torch.Generator().manual_seed(13)
    q, k, v, do = (torch.randn(1, 21, 2, 32, generator=g).to(device, dtype) for _ in range(4))
    o, lse, grads = _run_attention(q, k, v, do)
    ps = [torch.nn.Parameter(x.clone()) for x in (q, k, v)]
    o2, lse2 = flashport.attention(*ps, return_lse=True)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    o3 = ft.attention(*ps)
    o3.backward(do)
    assert torch.equal(o, o3)
    for a, p in zip(grads, ps):
        assert torch.equal(a, p.grad)


def test_output_allocation_failure(device):
    """An output torch cannot allocate (q a stride-0 view of 2^62 elements, whose size in bytes
    overflows, so no allocator and no overcommit setting can grant it): flashport.Error
    OUT_OF_MEMORY with the first line of torch's reason, through the plain API and
    flashport.torch."""
    dtype = _dtypes(device)[-1]
    q = torch.zeros(1, 1, 1, 64, device=device, dtype=dtype).expand(2**28, 2**28, 1, 64)
    for call in (flashport.attention, ft.attention):
        with pytest.raises(flashport.Error) as e:
            call(q, q, q)
        assert e.value.status_name == "FLASHPORT_ERR_OUT_OF_MEMORY"
        assert "\n" not in e.value.message and "allocat" in e.value.message


def test_second_order_gradients_are_refused(device):
    """The backward has no derivative: a gradient through gradients taken with create_graph
    (a gradient penalty) raises, on the eager path as through the op, never counts as zero."""
    dtype = _dtypes(device)[-1]
    q = torch.randn(1, 8, 2, 32, device=device, dtype=dtype)
    for route in (contextlib.nullcontext, _SeenOps):
        x = q.clone().requires_grad_(True)
        with route():
            o = ft.attention(x, x, x)
        g, = torch.autograd.grad(o.float().sum(), x, create_graph=True)
        assert g.requires_grad
        with pytest.raises(RuntimeError, match="flashport.attention_backward"):
            (o.float().sum() + g.float().square().sum()).backward()


def test_outputs_share_one_allocation(device):
    """The outputs a call allocates (o and lse; dq, dk, dv) come from one allocation of torch's,
    each a dense tensor of its own: they do not overlap, each is writable without touching the
    others, each stays valid after the others die, and (CUDA) the memory goes back to torch when
    the last of them dies. The values are those written into outputs passed with out=."""
    import gc

    dtype = _dtypes(device)[-1]
    g = torch.Generator().manual_seed(14)
    q, k, v, do = (torch.randn(2, 19, 4, 40, generator=g).to(device, dtype) for _ in range(4))
    k, v = k[:, :, :2].contiguous(), v[:, :, :2].contiguous()  # GQA: dk, dv smaller than dq
    want_o, want_lse = torch.empty_like(q), torch.empty(2, 4, 19, device=device)
    flashport.attention(q, k, v, causal=True, return_lse=True, out=(want_o, want_lse))
    want = [torch.empty_like(x) for x in (q, k, v)]
    flashport.attention_backward(do, q, k, v, want_o, want_lse, causal=True, out=want)

    def spans(ts):
        return sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in ts)

    if device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
    o, lse = flashport.attention(q, k, v, causal=True, return_lse=True)
    grads = list(flashport.attention_backward(do, q, k, v, o, lse, causal=True))
    for ts in ((o, lse), grads):
        s = spans(ts)
        assert all(a[1] <= b[0] for a, b in zip(s, s[1:])), "outputs overlap"
        assert all(t.is_contiguous() for t in ts)
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, 19) and o.shape == q.shape
    assert [t.shape for t in grads] == [q.shape, k.shape, v.shape]
    assert torch.equal(o, want_o) and torch.equal(lse, want_lse)
    for a, b in zip(grads, want):
        assert torch.equal(a, b)
    o.add_(1)
    assert torch.equal(lse, want_lse)
    del o
    grads[0].zero_()
    del grads[0]
    gc.collect()
    junk = [torch.randn(4096, device=device) for _ in range(8)]  # reuse of freed memory
    assert torch.equal(lse, want_lse) and torch.equal(grads[0], want[1])
    assert torch.equal(grads[1], want[2])
    del lse, grads, junk, ts, a, b  # the loops' variables hold the last outputs too
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == before
