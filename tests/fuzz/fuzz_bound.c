/*
 * The fuzz harness's error bounds (fuzz_bound.h), computed in double from the inputs.
 *
 * Notation: u = 2^-24, the f32 unit roundoff; u_t the storage dtype's (tu_unit_roundoff: f16
 * 2^-11, bf16 2^-8, f32 2^-24); eta the absolute error of a value that underflows: half the
 * smallest f16 subnormal for f16 operands, otherwise 2^-126 (the exp2 polynomial gives 0 below
 * f32's normal range, vcvtneps2bf16 flushes f32 subnormals).
 *
 * The model: a kernel that computes attention the way a flash kernel does, each step with its
 * standard rounding-error bound, every error bounded in first order by the magnitudes of the
 * terms it comes from:
 *   1. a score, scale q_i.k_j in f32: off by at most (D + 2) u scale sum_d |q_id k_jd| (a dot
 *      product of D terms, then the scale). The softcap c tanh(s / c) maps that interval through
 *      tanh, evaluated at both ends (in double), plus a few u of tanhf and the divisions; ALiBi's
 *      slope * distance adds u of itself and of the difference. err_s bounds the result, err_g
 *      the softcap derivative 1 - tanh^2 computed from it.
 *   2. an exponent, s_ij - m (forward, m the row maximum) or s_ij - LSE_i (backward, the LSE
 *      given), scaled into log2 units and through the exp2 polynomial (about 1 ulp): off by
 *      e <= err_s (+ the maximum's err_s) + 4 u (|s_ij| + |m|) + 4 u, so each P_ij is off by at
 *      most rel_p = expm1(e) relative, and their sum l by rel_p + (n + 2) u.
 *   3. P and dS rounded to the storage dtype before their products (as tensor-core kernels and
 *      the avx512bf16 table do; f32 products may keep them, the bound allows both): u_t of the
 *      value, plus eta.
 *   4. a sum of n products accumulated in f32: (n + 2) u sum |term| (Higham's gamma_n, the
 *      products' rounding included), n the number of terms the output may sum.
 *   5. dS_ij = P_ij g_ij (dP_ij - Delta_i), dP_ij = dO_i.V_j and Delta_i = dO_i.O_i, dot
 *      products of D terms: their difference is off by (D + 2) u (|dO_i|.|V_j| + |dO_i|.|O_i|),
 *      which on a pair whose dP ~ Delta is all of dS: an absolute, not a relative, error.
 * Each output's bound sums the error of every term it accumulates, times the magnitude of the
 * term's other factor: forward O_id from sum_j P_ij |V_jd| (P's error and the division by l);
 * dQ_id = scale sum_j dS_ij K_jd from sum_j err(dS_ij) |K_jd| + the accumulation's (n + 2) u
 * sum_j |dS_ij| |K_jd|; dK_jd likewise with |Q_id| over the rows of every head of its group;
 * dV_jd from sum_i err(P_ij) |dO_id|. A factor 2 covers what the first-order sum leaves out
 * (products of two relative errors, the largest u_t = 2^-8, and errors of the computed values
 * the bound's magnitudes stand for).
 * The reference computes in double, so its error before the final store is negligible next to
 * these; fb_store_slack adds the stores of both.
 */
#include "tests/fuzz/fuzz_bound.h"

#include "core/mask.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define U32    (1.0 / 16777216.0) /* 2^-24 */
#define SAFETY 2.0

static double eta_of(flashport_dtype dtype)
{
    return dtype == FLASHPORT_F16 ? ldexp(1.0, -25) : ldexp(1.0, -126);
}

double fb_store_slack(flashport_dtype dtype, double x, double y)
{
    return (tu_unit_roundoff(dtype) + U32) * (fabs(x) + fabs(y)) + 2.0 * eta_of(dtype);
}

/* One score in double, and bounds on an f32 kernel's error in it and in its softcap derivative
 * (steps 1 of the model). */
typedef struct score {
    double s, err_s;
    double g, err_g;
} score;

static score score_of(const tu_problem *p, int64_t h, int64_t i, int64_t j, int64_t nq, int64_t nk,
                      const float *q, const float *k)
{
    double dot = 0.0, mag = 0.0;
    for (int64_t d = 0; d < p->head_dim; d++) {
        const double x = (double)q[d] * k[d];
        dot += x;
        mag += fabs(x);
    }
    score r;
    const double raw = p->scale * dot, err_raw = (double)(p->head_dim + 2) * U32 * p->scale * mag;
    r.s = raw, r.err_s = err_raw, r.g = 1.0, r.err_g = 0.0;
    if (p->softcap > 0.0f) {
        /* t = tanh(x) of x known to +-dx: the interval's image, then tanhf's and the
         * divisions' rounding. */
        const double c = p->softcap, x = raw / c, dx = (err_raw + U32 * fabs(raw)) / c;
        const double t = tanh(x);
        const double dt =
            fmax(fabs(tanh(x + dx) - t), fabs(tanh(x - dx) - t)) + 4.0 * U32 * fabs(t);
        r.s = c * t;
        r.err_s = c * dt + U32 * fabs(r.s);
        r.g = 1.0 - t * t;
        r.err_g = fmin(1.0, 2.0 * fabs(t) * dt + dt * dt) + 2.0 * U32;
    }
    if (p->alibi) {
        const double a = (double)p->alibi[h] * fp_alibi_distance(i, j, nq, nk);
        r.s -= a;
        r.err_s += U32 * (fabs(a) + fabs(r.s));
    }
    return r;
}

/* Keys of sequence b the rows see: its used length (seqused_k) or its whole length. */
static int64_t keys_of(const tu_problem *p, int64_t b)
{
    return p->used_k ? p->used_k[b] : p->cu_k[b + 1] - p->cu_k[b];
}

int fb_forward_bound(const tu_problem *p, double *o_bound, double *lse_bound)
{
    const int64_t D = p->head_dim, H = p->heads, Hkv = p->kv_heads, group = H / Hkv;
    const int64_t total_q = p->cu_q[p->batch];
    int64_t nk_max = 1;
    for (int64_t b = 0; b < p->batch; b++)
        nk_max = keys_of(p, b) > nk_max ? keys_of(p, b) : nk_max;
    score *sc = malloc((size_t)nk_max * sizeof *sc);
    if (!sc)
        return -1;
    const double ut = tu_unit_roundoff(p->dtype), eta = eta_of(p->dtype);
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t q0 = p->cu_q[b], nq = p->cu_q[b + 1] - q0, k0 = p->cu_k[b];
        const int64_t nk = keys_of(p, b);
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < nq; i++) {
                const float *qrow = p->q + ((q0 + i) * H + h) * D;
                double *ob = o_bound + ((q0 + i) * H + h) * D;
                double m = -INFINITY, err_m = 0.0, e = 0.0, l = 0.0;
                int64_t n = 0;
                for (int64_t j = 0; j < nk; j++) {
                    if (!fp_mask_visible(i, j, nq, nk, p->window_left, p->window_right)) {
                        sc[j].s = -INFINITY;
                        continue;
                    }
                    sc[j] =
                        score_of(p, h, i, j, nq, nk, qrow, p->k + ((k0 + j) * Hkv + h / group) * D);
                    if (sc[j].s > m)
                        m = sc[j].s, err_m = sc[j].err_s;
                    n++;
                }
                for (int64_t d = 0; d < D; d++)
                    ob[d] = 0.0;
                lse_bound[h * total_q + q0 + i] = 0.0; /* no visible key: exactly -inf */
                if (n == 0)
                    continue;
                for (int64_t j = 0; j < nk; j++)
                    if (sc[j].s > -INFINITY) {
                        l += exp(sc[j].s - m);
                        e = fmax(e, sc[j].err_s + 4.0 * U32 * (fabs(sc[j].s) + fabs(m)));
                    }
                e += err_m + 4.0 * U32;
                const double rel_p = expm1(e), acc = (double)(n + 2) * U32;
                /* O = sum_j p_j V_j / l: each p_j and l off by rel_p (+ acc), p_j rounded. */
                for (int64_t j = 0; j < nk; j++) {
                    if (sc[j].s == -INFINITY)
                        continue;
                    const double pj = exp(sc[j].s - m) / l;
                    const double w = pj * (2.0 * rel_p + ut + 2.0 * acc) + eta / l;
                    const float *vrow = p->v + ((k0 + j) * Hkv + h / group) * D;
                    for (int64_t d = 0; d < D; d++)
                        ob[d] += w * fabs((double)vrow[d]);
                }
                for (int64_t d = 0; d < D; d++)
                    ob[d] *= SAFETY;
                const double lse = m + log(l);
                lse_bound[h * total_q + q0 + i] =
                    SAFETY * (e + rel_p + acc + 4.0 * U32 * (fabs(lse) + fabs(log(l))));
            }
    }
    free(sc);
    return 0;
}

int fb_backward_bound(const tu_problem *p, const float *o, const float *lse, const float *dout,
                      double *dq_bound, double *dk_bound, double *dv_bound)
{
    const int64_t D = p->head_dim, H = p->heads, Hkv = p->kv_heads, group = H / Hkv;
    const int64_t total_q = p->cu_q[p->batch], total_k = p->cu_k[p->batch];
    const double ut = tu_unit_roundoff(p->dtype), eta = eta_of(p->dtype);
    memset(dq_bound, 0, (size_t)(total_q * H * D) * sizeof(double));
    memset(dk_bound, 0, (size_t)(total_k * Hkv * D) * sizeof(double));
    memset(dv_bound, 0, (size_t)(total_k * Hkv * D) * sizeof(double));
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t q0 = p->cu_q[b], nq = p->cu_q[b + 1] - q0, k0 = p->cu_k[b];
        const int64_t nk = keys_of(p, b);
        /* Accumulation lengths: dQ over the keys, dK and dV over the group's rows. */
        const double acc_q = (double)(nk + 2) * U32, acc_k = (double)(group * nq + 2) * U32;
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < nq; i++) {
                const int64_t row = (q0 + i) * H + h;
                const float *qrow = p->q + row * D, *dorow = dout + row * D, *orow = o + row * D;
                const double L = lse[h * total_q + q0 + i];
                double *dqb = dq_bound + row * D;
                if (!(L > -INFINITY))
                    continue; /* no visible key: P = 0, exactly */
                double delta = 0.0, delta_mag = 0.0;
                for (int64_t d = 0; d < D; d++) {
                    delta += (double)dorow[d] * orow[d];
                    delta_mag += fabs((double)dorow[d] * orow[d]);
                }
                for (int64_t j = 0; j < nk; j++) {
                    if (!fp_mask_visible(i, j, nq, nk, p->window_left, p->window_right))
                        continue;
                    const int64_t kv = ((k0 + j) * Hkv + h / group) * D;
                    const float *krow = p->k + kv, *vrow = p->v + kv;
                    const score sc = score_of(p, h, i, j, nq, nk, qrow, krow);
                    const double e = sc.err_s + 4.0 * U32 * (fabs(sc.s) + fabs(L) + 1.0);
                    const double rel_p = expm1(e), pij = exp(sc.s - L);
                    double dp = 0.0, dp_mag = 0.0;
                    for (int64_t d = 0; d < D; d++) {
                        dp += (double)dorow[d] * vrow[d];
                        dp_mag += fabs((double)dorow[d] * vrow[d]);
                    }
                    const double ds = pij * sc.g * (dp - delta);
                    const double err_ds =
                        fabs(ds) * (rel_p + 4.0 * U32) +
                        pij * sc.g * (double)(D + 2) * U32 * (dp_mag + delta_mag) +
                        pij * sc.err_g * fabs(dp - delta);
                    /* The operands of the products, rounded to the storage dtype. */
                    const double ds_op = err_ds + ut * (fabs(ds) + err_ds) + eta;
                    const double p_op = pij * (rel_p + ut * (1.0 + rel_p)) + eta;
                    for (int64_t d = 0; d < D; d++) {
                        const double kd = fabs((double)krow[d]), qd = fabs((double)qrow[d]);
                        const double dod = fabs((double)dorow[d]);
                        dqb[d] += (ds_op + fabs(ds) * acc_q) * kd;
                        dk_bound[kv + d] += (ds_op + fabs(ds) * acc_k) * qd;
                        dv_bound[kv + d] += (p_op + pij * acc_k) * dod;
                    }
                }
                for (int64_t d = 0; d < D; d++)
                    dqb[d] *= SAFETY * p->scale;
            }
    }
    for (int64_t x = 0; x < total_k * Hkv * D; x++) {
        dk_bound[x] *= SAFETY * p->scale;
        dv_bound[x] *= SAFETY;
    }
    return 0;
}
