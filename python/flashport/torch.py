"""flashport for PyTorch: custom ops with autograd, torch.compile support, flash_attn's API.

    from flashport.torch import attention, flash_attn_func
    o = attention(q, k, v, causal=True)        # q, k, v: [B, N, heads, D], CPU or CUDA
    o.sum().backward()                         # dq, dk, dv through flashport's backward

Two ops in the ``flashport`` namespace, ``torch.ops.flashport.attention_forward`` (returns o and
lse) and ``torch.ops.flashport.attention_backward``; the forward has an autograd formula that
calls the backward op, and both have fake (meta) implementations, so torch.compile traces them
without running them. They run on the tensors' device, on torch's current stream. Their
autograd kernels run the implementation themselves when nothing lies between them and it in
torch's dispatch (plain CPU or CUDA tensors), instead of redispatching from Python.
``attention`` calls the op under torch.compile, tracing, dispatch / function modes and functorch
transforms; a plain eager call runs the op's own implementation without torch's dispatch of a
Python op (which costs more than the attention of a small problem), through an
``autograd.Function`` with the same formula when a gradient is wanted.

``flash_attn_func``, ``flash_attn_varlen_func``, ``flash_attn_qkvpacked_func`` and
``flash_attn_kvpacked_func`` take FlashAttention's arguments and layouts, so code written for
it runs unchanged (dropout is not supported: dropout_p must be 0; paged KV caches (block_table)
are not in flashport's C API yet).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.autograd import forward_ad

from . import _C
from ._api import _NO_DESCALE, _lse_shape, run_backward, run_forward
from ._errors import error
from ._frontends import frontend

__all__ = ["attention", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func",
           "flash_attn_kvpacked_func"]

_fe = frontend(torch.empty(0))


def _forward_impl(q: Tensor, k: Tensor, v: Tensor, alibi_slopes: Optional[Tensor],
                  cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], scale: float,
                  window_left: int, window_right: int, causal: bool, softcap: float,
                  max_seqlen_q: int, max_seqlen_k: int,
                  deterministic: bool) -> Tuple[Tensor, Tensor]:
    if _fe.allocates:  # the extension does everything through torch's exchange API
        return _C.forward(None, None, q, k, v, None, True, alibi_slopes, cu_seqlens_q,
                          cu_seqlens_k, scale, window_left, window_right, causal, softcap,
                          max_seqlen_q, max_seqlen_k, deterministic, None, None, *_NO_DESCALE,
                          _fe.fp8.get(q.dtype, 0))
    return run_forward(_fe, None, q, k, v, None, True, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                       scale, window_left, window_right, causal, softcap, max_seqlen_q,
                       max_seqlen_k, deterministic, None, None, _NO_DESCALE,
                       _fe.fp8.get(q.dtype, 0))


def _backward_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                   alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
                   cu_seqlens_k: Optional[Tensor], scale: float, window_left: int,
                   window_right: int, causal: bool, softcap: float, max_seqlen_q: int,
                   max_seqlen_k: int, deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    if _fe.allocates:
        return _C.backward(None, None, q, k, v, o, lse, dout, None, None, None, alibi_slopes,
                           cu_seqlens_q, cu_seqlens_k, scale, window_left, window_right, causal,
                           softcap, max_seqlen_q, max_seqlen_k, deterministic, None, None,
                           *_NO_DESCALE, _fe.fp8.get(q.dtype, 0))
    return run_backward(_fe, None, dout, q, k, v, o, lse, None, None, None, alibi_slopes,
                        cu_seqlens_q, cu_seqlens_k, scale, window_left, window_right, causal,
                        softcap, max_seqlen_q, max_seqlen_k, deterministic, None,
                        _fe.fp8.get(q.dtype, 0))


# The two ops, defined and registered through torch.library's low-level API rather than
# torch.library.custom_op: custom_op's own autograd kernel always redispatches from Python, so a
# dispatched call crosses from the dispatcher into Python twice (autograd, then the backend
# kernel), each time converting all 14 arguments. Here the autograd kernel calls the backend
# implementation itself whenever the dispatcher's next kernel would be exactly that (a CPU or
# CUDA tensor, nothing in between: no mode, subclass, fake tensor or functionalization), and
# redispatches otherwise, so whatever watches or transforms ops still sees the op.
_lib = torch.library.Library("flashport", "DEF")
_OPTIONAL_INPUTS = "Tensor? alibi_slopes, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k"
_PARAMS = ("float scale, SymInt window_left, SymInt window_right, bool causal, float softcap, "
           "SymInt max_seqlen_q, SymInt max_seqlen_k, bool deterministic")
_lib.define(f"attention_forward(Tensor q, Tensor k, Tensor v, {_OPTIONAL_INPUTS}, {_PARAMS}) "
            "-> (Tensor, Tensor)", tags=(torch.Tag.pt2_compliant_tag,))
_lib.define(f"attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, "
            f"Tensor lse, {_OPTIONAL_INPUTS}, {_PARAMS}) -> (Tensor, Tensor, Tensor)",
            tags=(torch.Tag.pt2_compliant_tag,))
_forward = torch.ops.flashport.attention_forward.default
_backward = torch.ops.flashport.attention_backward.default
_lib.impl("attention_forward", _forward_impl, "CompositeExplicitAutograd")
_lib.impl("attention_backward", _backward_impl, "CompositeExplicitAutograd")

_after_autograd = torch._C._after_autograd_keyset
_after_inplace_or_view = torch._C._after_ADInplaceOrView_keyset
_OWN_KERNEL_KEYS = (torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA)
_below_autograd = torch._C._AutoDispatchBelowAutograd
_any_requires_grad = torch._C._any_requires_grad
_grad_enabled = torch.is_grad_enabled


_impl_is_next = {}  # a keyset's bits -> _goes_to_impl's answer


def _goes_to_impl(keyset) -> bool:
    """Whether the dispatcher's next kernel after autograd is the op's own implementation. By
    the keyset's bits, remembered: the answer is theirs alone, and the DispatchKeySet methods
    that give it (the mask, the highest key, the comparisons) each cross pybind11, about a
    microsecond a call together where one raw_repr() and a lookup cost a fifth of that."""
    bits = keyset.raw_repr()
    impl = _impl_is_next.get(bits)
    if impl is None:
        impl = _impl_is_next[bits] = ((keyset & _after_inplace_or_view).highestPriorityTypeId()
                                      in _OWN_KERNEL_KEYS)
    return impl


def _redispatch(op, keyset, args):
    with _below_autograd():
        return op.redispatch(keyset & _after_autograd, *args)


@torch.library.register_fake("flashport::attention_forward", lib=_lib)
def _forward_fake(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, *args):
    lse_shape = _lse_shape(q, cu_seqlens_q is not None) or (0,)
    o_dtype = torch.bfloat16 if q.dtype in _fe.fp8 else q.dtype
    return (torch.empty_like(q, dtype=o_dtype), q.new_empty(lse_shape, dtype=torch.float32))


@torch.library.register_fake("flashport::attention_backward", lib=_lib)
def _backward_fake(dout, q, k, v, o, lse, *args):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class _Attention(torch.autograd.Function):
    """The forward's autograd formula: the op's autograd kernel, and attention()'s eager calls
    with a gradient (keyset None: plain tensors, the implementation called directly).

    apply(q, k, v, alibi_slopes, (keyset, cu_seqlens_q, cu_seqlens_k, params)): the arguments
    that are never differentiated travel in one tuple, and only q, k, v, o and lse are saved
    through save_for_backward (alibi_slopes and cu_seqlens, inputs that no gradient flows to,
    are kept on ctx): torch charges per argument of apply and per saved tensor, and on a small
    problem that is much of this path's host time."""

    @staticmethod
    def forward(ctx, q, k, v, alibi, rest):
        keyset, cu_q, cu_k, params = rest
        direct = keyset is None or _goes_to_impl(keyset)
        if direct and _fe.allocates:  # as _forward_impl, without its call in between
            o, lse = _C.forward(None, None, q, k, v, None, True, alibi, cu_q, cu_k, *params, None,
                                None, *_NO_DESCALE, _fe.fp8.get(q.dtype, 0))
        elif direct:
            o, lse = _forward_impl(q, k, v, alibi, cu_q, cu_k, *params)
        else:
            o, lse = _redispatch(_forward, keyset, (q, k, v, alibi, cu_q, cu_k, *params))
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.rest = (direct, alibi, cu_q, cu_k, params)  # one attribute: each costs
        ctx.mark_non_differentiable(lse)
        # The backward never reads lse's gradient: not having torch fill one with zeros each time.
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        direct, alibi, cu_q, cu_k, params = ctx.rest
        # A gradient arriving as a broadcast (o.sum().backward() gives stride 0 everywhere) or
        # otherwise without a unit last stride, which GPU backends need, becomes a dense copy.
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        # Through the backward op where the forward went through the dispatcher (so a mode or a
        # trace sees it), and with create_graph (grad mode on here), where the op's autograd
        # kernel refuses a gradient of these gradients instead of taking it as zero.
        backward = _backward_impl if direct and not _grad_enabled() else _backward
        return backward(dout, q, k, v, o, lse, alibi, cu_q, cu_k, *params) + (None, None)


class _NoDerivative(torch.autograd.Function):
    """The backward op's autograd formula: none, so a gradient through it raises."""

    @staticmethod
    def forward(ctx, keyset, *args):
        return _redispatch(_backward, keyset, args)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("flashport.attention_backward has no derivative: gradients of "
                           "flashport's gradients (create_graph) are not supported")


def _forward_autograd(keyset, *args):
    if _grad_enabled() and _any_requires_grad(*args[:4]):
        return _Attention.apply(*args[:4], (keyset, args[4], args[5], args[6:]))
    return _forward_impl(*args) if _goes_to_impl(keyset) else _redispatch(_forward, keyset, args)


def _backward_autograd(keyset, *args):
    if _grad_enabled() and _any_requires_grad(*args[:7]):
        return _NoDerivative.apply(keyset, *args)
    return _backward_impl(*args) if _goes_to_impl(keyset) else _redispatch(_backward, keyset, args)


_lib.impl("attention_forward", _forward_autograd, "Autograd", with_keyset=True)
_lib.impl("attention_backward", _backward_autograd, "Autograd", with_keyset=True)


_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_transforms = torch._C._are_functorch_transforms_active
_tracing = torch._C._get_tracing_state
_is_compiling = torch.compiler.is_compiling


def _max_len(cu, given):
    # Read from cu_seqlens when not given (on a GPU, a device-to-host copy: pass them to avoid it).
    if given is not None:
        return int(given)
    return _fe.max_len(cu) if cu is not None else 0


def _params(scale, window, causal, softcap, max_q, max_k, deterministic):
    """The op's scalar arguments, converted to its schema's types."""
    return (0.0 if scale is None else float(scale), int(window[0]), int(window[1]), bool(causal),
            float(softcap), max_q, max_k, bool(deterministic))


def attention(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None,
              scale=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
              max_seqlen_k=None, return_lse=False, deterministic=False):
    """flashport.attention for torch tensors, differentiable in q, k and v (lse is not).

    The arguments are flashport.attention's; deterministic asks the backward for bitwise
    identical gradients run after run. Returns o, or (o, lse) with return_lse.

    Under torch.compile, tracing, modes and transforms this is the custom op
    torch.ops.flashport.attention_forward; a plain eager call runs the same code without the
    op's dispatch (with torch.autograd.Function when a gradient is wanted).
    """
    if cu_seqlens_q is None and cu_seqlens_k is None and max_seqlen_q is None and \
            max_seqlen_k is None:
        max_q = max_k = 0
    else:
        max_q = _max_len(cu_seqlens_q, max_seqlen_q)
        max_k = _max_len(cu_seqlens_k, max_seqlen_k)
    o, lse = _attention(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_q, max_k, scale,
                        window, causal, softcap, deterministic)
    return (o, lse) if return_lse else o


def _attention(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_q, max_k, scale, window,
               causal, softcap, deterministic):
    """attention() once its arguments are read, positional (flash_attn_func calls it too, so
    both take the same path at the same cost): (o, lse)."""
    # The op where something watches or transforms ops: torch.compile, dispatch or function
    # modes (FakeTensorMode, make_fx, FlopCounterMode, torch.device()), functorch transforms,
    # forward-mode AD, torch.jit.trace, tensor subclasses. A plain eager call gets nothing from
    # torch's dispatch of a Python op but its cost, more than the attention of a small problem.
    if (_is_compiling() or type(q) is not Tensor or type(k) is not Tensor
            or type(v) is not Tensor or _dispatch_modes() or _function_modes() or _transforms()
            or forward_ad._current_level >= 0 or _tracing() is not None):
        return _forward(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                        *_params(scale, window, causal, softcap, max_q, max_k, deterministic))
    if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or
                            (alibi_slopes is not None and alibi_slopes.requires_grad)):
        return _Attention.apply(q, k, v, alibi_slopes,
                                (None, cu_seqlens_q, cu_seqlens_k,
                                 _params(scale, window, causal, softcap, max_q, max_k,
                                         deterministic)))
    if _fe.allocates:
        # No gradient, nothing watching: straight to the extension, which reads the arguments
        # as the op's schema would convert them (float, int, truth value).
        return _C.forward(None, None, q, k, v, None, True, alibi_slopes, cu_seqlens_q,
                          cu_seqlens_k, 0.0 if scale is None else scale, window[0], window[1],
                          causal, softcap, max_q, max_k, deterministic, None, None,
                          *_NO_DESCALE, _fe.fp8.get(q.dtype, 0))
    return _forward_impl(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                         *_params(scale, window, causal, softcap, max_q, max_k, deterministic))


def _check_flash_attn_args(dropout_p, block_table=None):
    if dropout_p:
        raise error("FLASHPORT_ERR_UNSUPPORTED_FEATURE",
                    f"dropout_p = {dropout_p}: flashport has no dropout (pass 0.0)")
    if block_table is not None:
        raise error("FLASHPORT_ERR_UNSUPPORTED_FEATURE",
                    "block_table: paged KV caches are not in flashport's API yet")


def _flash_attn_result(o, lse, return_attn_probs):
    # flash_attn returns (out, softmax_lse, S_dmask); S_dmask exists only with dropout.
    return (o, lse, None) if return_attn_probs else o


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """FlashAttention's flash_attn_func: q [B, Nq, H, D], k and v [B, Nk, Hkv, D]."""
    if dropout_p:
        _check_flash_attn_args(dropout_p)
    o, lse = _attention(q, k, v, alibi_slopes, None, None, 0, 0, softmax_scale, window_size,
                        causal, softcap, deterministic)
    return (o, lse, None) if return_attn_probs else o


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):
    """FlashAttention's flash_attn_varlen_func: q [total_q, H, D], k and v [total_k, Hkv, D],
    int32 cu_seqlens of B + 1 offsets."""
    _check_flash_attn_args(dropout_p, block_table)
    o, lse = attention(q, k, v, causal=causal, window=window_size, softcap=softcap,
                       alibi_slopes=alibi_slopes, scale=softmax_scale,
                       cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                       max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, return_lse=True,
                       deterministic=deterministic)
    return _flash_attn_result(o, lse, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """FlashAttention's flash_attn_qkvpacked_func: qkv [B, N, 3, H, D] (strided views, no copy)."""
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale,
                           causal, window_size, softcap, alibi_slopes, deterministic,
                           return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """FlashAttention's flash_attn_kvpacked_func: q [B, Nq, H, D], kv [B, Nk, 2, Hkv, D]."""
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, deterministic, return_attn_probs)
