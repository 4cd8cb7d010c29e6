"""flashport.attention and flashport.attention_backward on any DLPack tensor."""
from . import _C
from ._frontends import frontend


def _lse_shape(q, varlen):
    """lse is [B, H, Nq] for dense q [B, Nq, H, D], [H, total_q] for varlen q [total_q, H, D].
    None for a q of another rank, which the library then refuses with its own message."""
    shape = q.shape
    if varlen and len(shape) == 3:
        return (shape[1], shape[0])
    if not varlen and len(shape) == 4:
        return (shape[0], shape[2], shape[1])
    return None


def _max_lens(fe, cu_q, cu_k, max_q, max_k):
    if cu_q is None or cu_k is None:
        return (0 if max_q is None else max_q), (0 if max_k is None else max_k)
    # Read from cu_seqlens when not given (on a GPU, a device-to-host copy: pass them to avoid it).
    return (fe.max_len(cu_q) if max_q is None else max_q,
            fe.max_len(cu_k) if max_k is None else max_k)


def _opt(ex, x):
    return None if x is None else ex(x)


def attention(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None,
              scale=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
              max_seqlen_k=None, return_lse=False, backend=None, out=None, seqused_k=None,
              block_table=None):
    """Exact attention O = softmax(scale * Q K^T + masks) V, on the backend where q lives.

    q [B, Nq, H, D], k and v [B, Nk, Hkv, D] (H % Hkv == 0: GQA/MQA); varlen: [tokens, heads, D]
    with int32 cu_seqlens_q / cu_seqlens_k of B + 1 offsets. Any strides. float32, float16 or
    bfloat16 (q, k, v alike). Any tensor that speaks DLPack: NumPy, torch (CPU or CUDA), CuPy,
    array-API arrays; results come back in q's own type, on q's device.

    causal: bottom-right aligned causal mask. window (left, right): sliding window in keys, -1 =
    unbounded, bottom-right aligned. softcap c > 0: S = c * tanh(S / c). alibi_slopes: float32
    [H], S -= slope * |i + Nk - Nq - j|. scale: default 1 / sqrt(D). max_seqlen_q/k: varlen
    bounds (read from cu_seqlens when None). return_lse: also return the row log-sum-exp, float32
    [B, H, Nq] (varlen [H, total_q]), which attention_backward needs. backend: "cpu",
    "reference", "cuda", "hip" or a plugin's name; None picks the backend of q's memory.
    out: outputs to write instead of new ones: o, or (o, lse) with return_lse.

    KV cache: seqused_k, int32 [B]: sequence b uses keys 0 .. seqused_k[b] - 1 only (the masks
    align to that count). block_table, int32 [B, pages per sequence], contiguous: k and v are a
    paged cache [num_pages, page_size, Hkv, D], key t of sequence b in row t % page_size of page
    block_table[b, t // page_size]; needs seqused_k and dense q; forward only.

    GPU work is enqueued on the caller's current stream (torch's or CuPy's) and not waited for.
    Raises flashport.Error (status name and the library's message) on bad input.
    """
    fe = frontend(q)
    if out is not None:
        o, lse = out if return_lse else (out, None)
    else:
        o = fe.empty_like(q)
        lse = None
        if return_lse:
            shape = _lse_shape(q, cu_seqlens_q is not None)
            if shape is not None:
                lse = fe.empty_f32(shape, q)
    max_q, max_k = _max_lens(fe, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    ex = fe.export
    _C.forward(backend, fe.stream(q), ex(q), ex(k), ex(v), ex(o), _opt(ex, lse),
               _opt(ex, alibi_slopes), _opt(ex, cu_seqlens_q), _opt(ex, cu_seqlens_k),
               0.0 if scale is None else scale, window[0], window[1], causal, softcap, max_q,
               max_k, False, _opt(ex, seqused_k), _opt(ex, block_table))
    return (o, lse) if return_lse else o


def attention_backward(dout, q, k, v, o, lse, *, causal=False, window=(-1, -1), softcap=0.0,
                       alibi_slopes=None, scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                       max_seqlen_q=None, max_seqlen_k=None, deterministic=False, backend=None,
                       out=None, seqused_k=None):
    """dq, dk, dv of attention(q, k, v, ...) for the output gradient dout.

    o and lse are the forward's (attention(..., return_lse=True)); the keyword arguments must be
    those of the forward. dk and dv are summed over the query heads that share a kv head.
    deterministic: bitwise identical gradients run after run. out: (dq, dk, dv) to write instead
    of new ones. seqused_k as in attention (the dk, dv rows of unused keys are zeros). Returns
    (dq, dk, dv) in q's type.
    """
    fe = frontend(q)
    if out is not None:
        dq, dk, dv = out
    else:
        dq, dk, dv = fe.empty_like(q), fe.empty_like(k), fe.empty_like(v)
    max_q, max_k = _max_lens(fe, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    ex = fe.export
    _C.backward(backend, fe.stream(q), ex(q), ex(k), ex(v), ex(o), ex(lse), ex(dout), ex(dq),
                ex(dk), ex(dv), _opt(ex, alibi_slopes), _opt(ex, cu_seqlens_q),
                _opt(ex, cu_seqlens_k), 0.0 if scale is None else scale, window[0], window[1],
                causal, softcap, max_q, max_k, deterministic, _opt(ex, seqused_k), None)
    return dq, dk, dv
