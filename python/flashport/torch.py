"""flashport for PyTorch: custom ops with autograd, torch.compile support, flash_attn's API.

    from flashport.torch import attention, flash_attn_func
    o = attention(q, k, v, causal=True)        # q, k, v: [B, N, heads, D], CPU or CUDA
    o.sum().backward()                         # dq, dk, dv through flashport's backward

Two ops in the ``flashport`` namespace, ``torch.ops.flashport.attention_forward`` (returns o and
lse) and ``torch.ops.flashport.attention_backward``; the forward has an autograd formula that
calls the backward op, and both have fake (meta) implementations, so torch.compile traces them
without running them. They run on the tensors' device, on torch's current stream.

``flash_attn_func``, ``flash_attn_varlen_func``, ``flash_attn_qkvpacked_func`` and
``flash_attn_kvpacked_func`` take FlashAttention's arguments and layouts, so code written for
it runs unchanged (dropout is not supported: dropout_p must be 0; paged KV caches (block_table)
are not in flashport's C API yet).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _C
from ._errors import error
from ._frontends import frontend

__all__ = ["attention", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func",
           "flash_attn_kvpacked_func"]

_fe = frontend(torch.empty(0))


def _lse_shape(q: Tensor, varlen: bool):
    # dense q [B, Nq, H, D] -> [B, H, Nq]; varlen q [total_q, H, D] -> [H, total_q]
    if varlen:
        return (q.shape[1], q.shape[0]) if q.dim() == 3 else (0,)
    return (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (0,)


def _opt(x):
    return None if x is None else _fe.export(x)


@torch.library.custom_op("flashport::attention_forward", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, alibi_slopes: Optional[Tensor],
             cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], scale: float,
             window_left: int, window_right: int, causal: bool, softcap: float,
             max_seqlen_q: int, max_seqlen_k: int, deterministic: bool) -> Tuple[Tensor, Tensor]:
    o = torch.empty_like(q)
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32)
    ex = _fe.export
    _C.forward(None, _fe.stream(q), ex(q), ex(k), ex(v), ex(o), ex(lse), _opt(alibi_slopes),
               _opt(cu_seqlens_q), _opt(cu_seqlens_k), scale, window_left, window_right, causal,
               softcap, max_seqlen_q, max_seqlen_k, deterministic, None, None)
    return o, lse


@_forward.register_fake
def _forward_fake(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, scale, window_left,
                  window_right, causal, softcap, max_seqlen_q, max_seqlen_k, deterministic):
    return (torch.empty_like(q),
            q.new_empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32))


@torch.library.custom_op("flashport::attention_backward", mutates_args=())
def _backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
              alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
              cu_seqlens_k: Optional[Tensor], scale: float, window_left: int, window_right: int,
              causal: bool, softcap: float, max_seqlen_q: int, max_seqlen_k: int,
              deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    ex = _fe.export
    _C.backward(None, _fe.stream(q), ex(q), ex(k), ex(v), ex(o), ex(lse), ex(dout), ex(dq),
                ex(dk), ex(dv), _opt(alibi_slopes), _opt(cu_seqlens_q), _opt(cu_seqlens_k), scale,
                window_left, window_right, causal, softcap, max_seqlen_q, max_seqlen_k,
                deterministic, None, None)
    return dq, dk, dv


@_backward.register_fake
def _backward_fake(dout, q, k, v, o, lse, *args):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    (q, k, v, alibi, cu_q, cu_k, scale, wl, wr, causal, softcap, max_q, max_k,
     deterministic) = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, alibi, cu_q, cu_k)
    ctx.params = (scale, wl, wr, causal, softcap, max_q, max_k, deterministic)
    ctx.mark_non_differentiable(lse)


def _autograd_backward(ctx, dout, dlse):
    q, k, v, o, lse, alibi, cu_q, cu_k = ctx.saved_tensors
    # A gradient arriving as a broadcast (o.sum().backward() gives stride 0 everywhere) or
    # otherwise without a unit last stride, which GPU backends need, becomes a dense copy.
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv = _backward(dout, q, k, v, o, lse, alibi, cu_q, cu_k, *ctx.params)
    return (dq, dk, dv) + (None,) * 11


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def _max_len(cu, given):
    # Read from cu_seqlens when not given (on a GPU, a device-to-host copy: pass them to avoid it).
    if given is not None:
        return int(given)
    return _fe.max_len(cu) if cu is not None else 0


def attention(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None,
              scale=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
              max_seqlen_k=None, return_lse=False, deterministic=False):
    """flashport.attention for torch tensors, differentiable in q, k and v (lse is not).

    The arguments are flashport.attention's; deterministic asks the backward for bitwise
    identical gradients run after run. Returns o, or (o, lse) with return_lse.
    """
    o, lse = _forward(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                      0.0 if scale is None else float(scale), int(window[0]), int(window[1]),
                      bool(causal), float(softcap), _max_len(cu_seqlens_q, max_seqlen_q),
                      _max_len(cu_seqlens_k, max_seqlen_k), bool(deterministic))
    return (o, lse) if return_lse else o


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
    _check_flash_attn_args(dropout_p)
    o, lse = attention(q, k, v, causal=causal, window=window_size, softcap=softcap,
                       alibi_slopes=alibi_slopes, scale=softmax_scale, return_lse=True,
                       deterministic=deterministic)
    return _flash_attn_result(o, lse, return_attn_probs)


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
