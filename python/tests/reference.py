"""The tests' oracle in NumPy, float64: attention forward (O, LSE) and backward (dQ, dK, dV)
written from the semantics in include/flashport.h, materializing S and P (test sizes only).

Layouts as flashport's: q [B, Nq, H, D], k and v [B, Nk, Hkv, D], lse [B, H, Nq].
"""
import numpy as np


def _scores(q, k, causal, window, softcap, alibi, scale):
    B, Nq, H, D = q.shape
    Nk, Hkv = k.shape[1], k.shape[2]
    kk = np.repeat(k, H // Hkv, axis=2)  # query head h reads kv head h // (H / Hkv)
    S = np.einsum("bihd,bjhd->bhij", q, kk) * scale
    T = None
    if softcap:
        T = np.tanh(S / softcap)
        S = softcap * T
    i = np.arange(Nq)[:, None] + (Nk - Nq)  # bottom-right alignment
    j = np.arange(Nk)[None, :]
    if alibi is not None:
        S = S - np.asarray(alibi, np.float64)[None, :, None, None] * np.abs(i - j)[None, None]
    left, right = window
    if causal:
        right = 0
    visible = np.ones((Nq, Nk), bool)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    return np.where(visible, S, -np.inf), T, kk


def forward(q, k, v, causal=False, window=(-1, -1), softcap=0.0, alibi=None, scale=None):
    """O [B, Nq, H, D] and LSE [B, H, Nq] (-inf and O = 0 for rows that see no key)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    S, _, _ = _scores(q, k, causal, window, softcap, alibi, scale)
    P, lse = _softmax(S)
    vv = np.repeat(v, q.shape[2] // v.shape[2], axis=2)
    return np.einsum("bhij,bjhd->bihd", P, vv), lse


def _softmax(S):
    m = S.max(-1, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    E = np.exp(S - m)
    l = E.sum(-1, keepdims=True)
    P = np.where(l > 0, E / np.where(l > 0, l, 1.0), 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(l > 0, np.log(l) + m, -np.inf)[..., 0]
    return P, lse


def backward(dout, q, k, v, causal=False, window=(-1, -1), softcap=0.0, alibi=None, scale=None):
    """dQ, dK, dV (dK, dV summed over the query heads of each kv head)."""
    dout, q, k, v = (np.asarray(x, np.float64) for x in (dout, q, k, v))
    B, Nq, H, D = q.shape
    Nk, Hkv = k.shape[1], k.shape[2]
    g = H // Hkv
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    S, T, kk = _scores(q, k, causal, window, softcap, alibi, scale)
    P, _ = _softmax(S)
    vv = np.repeat(v, g, axis=2)
    dv = np.einsum("bhij,bihd->bjhd", P, dout)
    dP = np.einsum("bihd,bjhd->bhij", dout, vv)
    dS = P * (dP - (P * dP).sum(-1, keepdims=True))
    if softcap:
        dS = dS * (1.0 - T * T)
    dq = np.einsum("bhij,bjhd->bihd", dS, kk) * scale
    dk = np.einsum("bhij,bihd->bjhd", dS, q) * scale
    fold = lambda x: x.reshape(B, Nk, Hkv, g, D).sum(3)  # noqa: E731
    return dq, fold(dk), fold(dv)


def varlen_forward(q, k, v, cu_q, cu_k, **kw):
    """Packed q [total_q, H, D], k and v [total_k, Hkv, D]: O packed, LSE [H, total_q]."""
    o = np.zeros(q.shape, np.float64)
    lse = np.zeros((q.shape[1], q.shape[0]), np.float64)
    for b in range(len(cu_q) - 1):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if cu_q[b + 1] == cu_q[b]:
            continue
        ob, lb = forward(q[None, sq], k[None, sk], v[None, sk], **kw)
        o[sq], lse[:, sq] = ob[0], lb[0]
    return o, lse


def varlen_backward(dout, q, k, v, cu_q, cu_k, **kw):
    dq = np.zeros(q.shape, np.float64)
    dk = np.zeros(k.shape, np.float64)
    dv = np.zeros(v.shape, np.float64)
    for b in range(len(cu_q) - 1):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        g = backward(dout[None, sq], q[None, sq], k[None, sk], v[None, sk], **kw)
        dq[sq], dk[sk], dv[sk] = g[0][0], g[1][0], g[2][0]
    return dq, dk, dv


def fp8_values(codes, fmt):
    """The float64 values of fp8 codes (uint8), by the OCP definitions: e4m3 (E4M3FN: bias 7,
    0x7f / 0xff NaN) and e5m2 (bias 15, IEEE-like infinities and NaNs)."""
    c = np.asarray(codes, np.int64)
    mb, bias = (3, 7) if fmt == "e4m3" else (2, 15)
    e, m = (c & 0x7F) >> mb, c & ((1 << mb) - 1)
    mag = np.where(e == 0, m * 2.0 ** (1 - bias - mb), (1 + m / 2.0 ** mb) * 2.0 ** (e - bias))
    if fmt == "e4m3":
        mag = np.where((c & 0x7F) == 0x7F, np.nan, mag)
    else:
        mag = np.where(e == 31, np.where(m == 0, np.inf, np.nan), mag)
    return np.where(c & 0x80, -mag, mag)


def round_e4m3(x):
    """x >= 0 rounded to the nearest e4m3 value, ties to the even code (docs/semantics.md: the
    rounding of P in the fp8 forward)."""
    table = fp8_values(np.arange(0x7F), "e4m3")  # 0 .. 448, increasing
    x = np.asarray(x, np.float64)
    hi = np.clip(np.searchsorted(table, x), 1, len(table) - 1)
    lo = hi - 1
    dlo, dhi = x - table[lo], table[hi] - x
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return table[pick]


def forward_fp8(q, k, v, descale=(1.0, 1.0, 1.0), round_p=True, causal=False, window=(-1, -1),
                softcap=0.0, alibi=None, scale=None):
    """The fp8 forward of docs/semantics.md on the dequantization-free values q, k, v (float64 of
    the codes): S scaled by descale_q * descale_k, P = exp(S - max) rounded to e4m3 (round_p) in
    the numerator, the row sum of the unrounded P, O times descale_v. O and LSE."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    S, _, _ = _scores(q, k, causal, window, softcap, alibi, scale * descale[0] * descale[1])
    m = S.max(-1, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    E = np.exp(S - m)
    l = E.sum(-1, keepdims=True)
    Pn = round_e4m3(E) if round_p else E
    P = np.where(l > 0, Pn / np.where(l > 0, l, 1.0), 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(l > 0, np.log(l) + m, -np.inf)[..., 0]
    vv = np.repeat(v, q.shape[2] // v.shape[2], axis=2)
    return descale[2] * np.einsum("bhij,bjhd->bihd", P, vv), lse
