"""flashport.attention and flashport.attention_backward on any DLPack tensor."""
from . import _C
from ._errors import error
from ._frontends import _frontends, frontend

# fp8 formats by name (attention(fp8=...)), as flashport_dtype codes
_FP8_NAMES = {"e4m3": 3, "e5m2": 4}
_NO_DESCALE = (0.0, 0.0, 0.0)


def _fp8_code(fe, q, fp8):
    """0, or the flashport dtype of fp8 q, k, v: named by fp8 (uint8 arrays holding the codes),
    or read from the framework's float8 dtype."""
    if fp8 is not None:
        if fp8 not in _FP8_NAMES:
            raise error("FLASHPORT_ERR_INVALID_VALUE",
                        f"fp8 = {fp8!r}: expected None, 'e4m3' or 'e5m2'")
        return _FP8_NAMES[fp8]
    return fe.fp8.get(getattr(q, "dtype", None), 0) if fe.fp8 else 0


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


# Where a frontend allocates in Python (``in_one_buffer``), a call's outputs are views into one
# new buffer, each at a 256-byte aligned offset (the extension's rule for its own allocations):
# one allocation and one free a call instead of one each. Their layouts, by the outputs' shapes
# and dtypes, are computed once; the table is emptied when it reaches _MAX_LAYOUTS entries
# (varlen shapes change with every batch's token count).
_ALIGN = 256
_MAX_LAYOUTS = 256
_layouts = {}


def _layout(specs):
    offsets, total = [], 0
    for shape, dtype in specs:
        offset = -(-total // _ALIGN) * _ALIGN
        size = dtype.itemsize
        for n in shape:
            size *= n
        offsets.append(offset)
        total = offset + size
    return total, tuple(offsets)


def _in_one_buffer(fe, like, specs):
    """New arrays of fe's framework on like's device, one a (shape, dtype) of specs, and their
    addresses, which the extension writes the outputs at (an output given as an int): the
    extension describes each one itself instead of exporting it through __dlpack__."""
    if len(specs) == 1:
        x = fe.new(*specs[0], like)
        return (x,), (fe.address(x),)
    layout = _layouts.get(specs)
    if layout is None:
        if len(_layouts) >= _MAX_LAYOUTS:
            _layouts.clear()
        layout = _layouts[specs] = _layout(specs)
    total, offsets = layout
    buf = fe.new((total,), fe.uint8, like)
    base = fe.address(buf)
    return (tuple(fe.view(buf, off, shape, dtype) for off, (shape, dtype) in zip(offsets, specs)),
            tuple(base + off for off in offsets))


def _exported(fe, tensors):
    return tuple(None if x is None else fe.export(x) for x in tensors)


def run_forward(fe, backend, q, k, v, o, lse, alibi, cu_q, cu_k, scale, window_left,
                window_right, causal, softcap, max_q, max_k, deterministic, seqused_k,
                block_table, descale, code):
    """The forward on q's frontend fe; o None and lse True are allocated (lse None: not
    computed), by the extension where the framework lets it. Returns (o, lse)."""
    o_at, lse_at = o, lse
    if not fe.allocates:
        # lse's shape, or None where q's rank gives it none (the library then refuses q)
        lse_shape = _lse_shape(q, cu_q is not None) if lse is True else None
        if o is None and not code and fe.in_one_buffer:
            if lse_shape is None:
                (o,), (o_at,) = _in_one_buffer(fe, q, ((q.shape, q.dtype),))
                lse = lse_at = None
            else:
                (o, lse), (o_at, lse_at) = _in_one_buffer(
                    fe, q, ((q.shape, q.dtype), (lse_shape, fe.float32)))
        else:
            if o is None:
                o = o_at = fe.empty_fp8_out(q) if code else fe.empty_like(q)
            if lse is True:
                lse = lse_at = None if lse_shape is None else fe.empty_f32(lse_shape, q)
    if fe.raw:
        _C.forward(backend, fe.stream(q) if fe.names_stream else None, q, k, v, o_at, lse_at,
                   alibi, cu_q, cu_k, scale, window_left, window_right, causal, softcap, max_q,
                   max_k, deterministic, seqused_k, block_table, *descale, code)
        return o, lse
    t = _exported(fe, (q, k, v, o, lse, alibi, cu_q, cu_k, seqused_k, block_table))
    _C.forward(backend, fe.stream(q), *t[:8], scale, window_left, window_right, causal, softcap,
               max_q, max_k, deterministic, t[8], t[9], *descale, code)
    return o, lse


def run_backward(fe, backend, dout, q, k, v, o, lse, dq, dk, dv, alibi, cu_q, cu_k, scale,
                 window_left, window_right, causal, softcap, max_q, max_k, deterministic,
                 seqused_k, code):
    """The backward on q's frontend fe; dq, dk, dv None are allocated, by the extension where
    the framework lets it. code: q's fp8 dtype (the library refuses fp8). Returns (dq, dk, dv)."""
    at = (dq, dk, dv)
    if not fe.allocates and dq is None:
        if fe.in_one_buffer:
            (dq, dk, dv), at = _in_one_buffer(
                fe, q, ((q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype)))
        else:
            dq, dk, dv = at = fe.empty_like(q), fe.empty_like(k), fe.empty_like(v)
    if fe.raw:
        _C.backward(backend, fe.stream(q) if fe.names_stream else None, q, k, v, o, lse, dout,
                    *at, alibi, cu_q, cu_k, scale, window_left, window_right, causal, softcap,
                    max_q, max_k, deterministic, seqused_k, None, *_NO_DESCALE, code)
        return dq, dk, dv
    t = _exported(fe, (q, k, v, o, lse, dout, dq, dk, dv, alibi, cu_q, cu_k, seqused_k))
    _C.backward(backend, fe.stream(q), *t[:12], scale, window_left, window_right, causal,
                softcap, max_q, max_k, deterministic, t[12], None, *_NO_DESCALE, code)
    return dq, dk, dv


def attention(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None,
              scale=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
              max_seqlen_k=None, return_lse=False, backend=None, out=None, descale=None,
              fp8=None, seqused_k=None, block_table=None):
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

    fp8 inputs (forward only, docs/semantics.md "fp8 forward"): torch float8_e4m3fn /
    float8_e5m2 q, k, v, or uint8 arrays of fp8 codes with fp8="e4m3" / "e5m2" (for frameworks
    without fp8 dtypes). descale=(dq, dk, dv): their per-tensor dequantization factors (default
    1). o is bfloat16 (torch) or float16 (NumPy, CuPy, others), or out's dtype (bf16 or f16).

    KV cache: seqused_k, int32 [B]: sequence b uses keys 0 .. seqused_k[b] - 1 only (the masks
    align to that count). block_table, int32 [B, pages per sequence], contiguous: k and v are a
    paged cache [num_pages, page_size, Hkv, D], key t of sequence b in row t % page_size of page
    block_table[b, t // page_size]; needs seqused_k and dense q; forward only.

    GPU work is enqueued on the caller's current stream (torch's or CuPy's) and not waited for.
    Raises flashport.Error (status name and the library's message) on bad input.
    """
    fe = _frontends.get(type(q)) or frontend(q)
    if out is None:
        o, lse = None, (True if return_lse else None)
    else:
        o, lse = out if return_lse else (out, None)
    if cu_seqlens_q is None and max_seqlen_q is None and max_seqlen_k is None:
        max_q = max_k = 0
    else:
        max_q, max_k = _max_lens(fe, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    code = _fp8_code(fe, q, fp8)
    scale = 0.0 if scale is None else scale
    if fe.allocates:
        # The framework's exchange API does everything from C: no layer in between.
        o, lse = _C.forward(backend, None, q, k, v, o, lse, alibi_slopes, cu_seqlens_q,
                            cu_seqlens_k, scale, window[0], window[1], causal, softcap, max_q,
                            max_k, False, seqused_k, block_table, *(descale or _NO_DESCALE), code)
    else:
        o, lse = run_forward(fe, backend, q, k, v, o, lse, alibi_slopes, cu_seqlens_q,
                             cu_seqlens_k, scale, window[0], window[1], causal, softcap, max_q,
                             max_k, False, seqused_k, block_table, descale or _NO_DESCALE, code)
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
    fe = _frontends.get(type(q)) or frontend(q)
    dq, dk, dv = (None, None, None) if out is None else out
    if cu_seqlens_q is None and max_seqlen_q is None and max_seqlen_k is None:
        max_q = max_k = 0
    else:
        max_q, max_k = _max_lens(fe, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    scale = 0.0 if scale is None else scale
    code = _fp8_code(fe, q, None)
    if fe.allocates:
        return _C.backward(backend, None, q, k, v, o, lse, dout, dq, dk, dv, alibi_slopes,
                           cu_seqlens_q, cu_seqlens_k, scale, window[0], window[1], causal,
                           softcap, max_q, max_k, deterministic, seqused_k, None, *_NO_DESCALE,
                           code)
    return run_backward(fe, backend, dout, q, k, v, o, lse, dq, dk, dv, alibi_slopes,
                        cu_seqlens_q, cu_seqlens_k, scale, window[0], window[1], causal, softcap,
                        max_q, max_k, deterministic, seqused_k, code)
