/* The needle v2 decode step for the CPU in plain C: every layer of m positions in one call.

   Why C: an eager PyTorch step at the shipped geometry is a few thousand tiny operator
   dispatches (27 layers of norms, lane routing and 40 Sinkhorn normalisations of a 4x4
   matrix), each costing microseconds while doing nanoseconds of arithmetic. Here the same
   math is a loop, and the weight products stream the float32 matrices once.

   Reproducibility: compiled without -ffast-math and with -ffp-contract=off, so every
   product and sum is an IEEE float32 operation in the order written here; the dot products
   (dots.c) give a row the same bits however many rows share the call (prefill == steps).

   Shapes (float32, row-major): weight matrices are [out, in]; the KV ring is
   [L, KV, R, hd] with slot = pos % R; lanes X are [m, n, d]. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX__
#include <immintrin.h>
#endif

#include "native.h"
#include "captures.h"
#include "faults.h"
#include "stages.h"

/* ---- small helpers ---- */

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

static float rms_inv(const float *x, int64_t n, float eps)
{
    return 1.0f / sqrtf(nat_dot(x, x, n) / (float)n + eps);
}

/* (1 + g) * x / rms(x) */
static void zc(const float *x, const float *g, int64_t n, float eps, float *y)
{
    float r = rms_inv(x, n, eps);
    for (int64_t i = 0; i < n; i++) y[i] = (1.0f + g[i]) * x[i] * r;
}

static void rope(float *x, const float *c, const float *s, int64_t hd)
{
    int64_t half = hd / 2;
    for (int64_t i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * c[i] - b * s[i];
        x[i + half] = b * c[i] + a * s[i];
    }
}

static float lse(const float *z, int64_t stride, int64_t n)
{
    float mx = -INFINITY, s = 0.0f;
    for (int64_t i = 0; i < n; i++) mx = z[i * stride] > mx ? z[i * stride] : mx;
    for (int64_t i = 0; i < n; i++) s += expf(z[i * stride] - mx);
    return mx + logf(s);
}

/* Log-domain Sinkhorn on an n x n matrix in place (rows, then columns, `iters` times),
   then exp: the doubly stochastic mixing matrix of the lanes. */
void nat_sinkhorn(float *z, int64_t n, int64_t iters)
{
    for (int64_t it = 0; it < iters; it++) {
        for (int64_t i = 0; i < n; i++) {
            float l = lse(z + i * n, 1, n);
            for (int64_t j = 0; j < n; j++) z[i * n + j] -= l;
        }
        for (int64_t j = 0; j < n; j++) {
            float l = lse(z + j, n, n);
            for (int64_t i = 0; i < n; i++) z[i * n + j] -= l;
        }
    }
    for (int64_t i = 0; i < n * n; i++) z[i] = expf(z[i]);
}

/* Unnormalised Walsh-Hadamard transform in natural (Sylvester) order, then the scale. */
void nat_fwht(float *x, int64_t n, float scale)
{
#ifdef __AVX__
    /* The same butterflies: stages 1, 2 and 4 stay inside each 8-block, so they run there
       in registers (a + b and a - b both formed, then blended), and wider stages 8 at a time;
       every output is the scalar loop's a + b or a - b. */
    if (n % 8 == 0) {
        const __m256 sc = _mm256_set1_ps(scale);
        for (int64_t i = 0; i < n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i), a, b;
            a = _mm256_moveldup_ps(v), b = _mm256_movehdup_ps(v);
            v = _mm256_blend_ps(_mm256_add_ps(a, b), _mm256_sub_ps(a, b), 0xAA);
            a = _mm256_shuffle_ps(v, v, _MM_SHUFFLE(1, 0, 1, 0));
            b = _mm256_shuffle_ps(v, v, _MM_SHUFFLE(3, 2, 3, 2));
            v = _mm256_blend_ps(_mm256_add_ps(a, b), _mm256_sub_ps(a, b), 0xCC);
            a = _mm256_permute2f128_ps(v, v, 0x00), b = _mm256_permute2f128_ps(v, v, 0x11);
            v = _mm256_blend_ps(_mm256_add_ps(a, b), _mm256_sub_ps(a, b), 0xF0);
            if (n == 8) v = _mm256_mul_ps(v, sc);
            _mm256_storeu_ps(x + i, v);
        }
        if (n == 8) return;
        for (int64_t h = 8; h < n; h <<= 1)
            for (int64_t i = 0; i < n; i += h << 1)
                for (int64_t j = i; j < i + h; j += 8) {
                    __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
                    _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
                    _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
                }
        for (int64_t i = 0; i < n; i += 8)
            _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sc));
        return;
    }
#endif
    for (int64_t h = 1; h < n; h <<= 1)
        for (int64_t i = 0; i < n; i += h << 1)
            for (int64_t j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    for (int64_t i = 0; i < n; i++) x[i] *= scale;
}

/* out[t] = (((0 + w[0] * X[t]) + w[1] * X[d + t]) + ...) over the n lanes, for t < cnt: the
   lane sums of the step, each t its own chain in lane order (8 t's per vector, no fusing,
   so the bits are the scalar loop's). */
static void mix_lanes(const float *w, int64_t n, const float *X, int64_t d, int64_t cnt,
                      float *out)
{
    int64_t t = 0;
#ifdef __AVX__
    for (; t + 8 <= cnt; t += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t l = 0; l < n; l++)
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(w[l]),
                                                   _mm256_loadu_ps(X + l * d + t)));
        _mm256_storeu_ps(out + t, acc);
    }
#endif
    for (; t < cnt; t++) {
        float acc = 0.0f;
        for (int64_t l = 0; l < n; l++) acc += w[l] * X[l * d + t];
        out[t] = acc;
    }
}

/* ---- scratch ---- */

typedef struct {
    float *nx, *r, *hpre, *u, *alpha, *bx, *h, *hpost, *res, *qkvg, *og, *a,
          *q, *kk, *o, *scores, *hbuf, *ap, *z, *mi, *mo, *y, *xn, *X, *ek, *ev, *e, *kv,
          *xp, *tmp;
} Scratch;

static int64_t nq_of(const NModel *M) { return 2 * M->H * M->hd + 2 * M->KV * M->hd; }
static int64_t nr_of(const NModel *M) { return 2 * M->n + M->n * M->n; }

static float *carve(const NModel *M, int64_t m, float *base, Scratch *s)
{
    int64_t n = M->n, d = M->d, attn = M->H * M->hd;
    float *p = base;
#define TAKE(f, cnt) do { s->f = p; p += (cnt); } while (0)
    TAKE(nx, m * n * d); TAKE(r, m * nr_of(M)); TAKE(hpre, m * n); TAKE(u, m * d);
    TAKE(alpha, m); TAKE(bx, m * d); TAKE(h, m * d); TAKE(hpost, m * n); TAKE(res, m * n * n);
    TAKE(qkvg, m * nq_of(M)); TAKE(og, m * attn); TAKE(a, m * d);
    TAKE(q, attn); TAKE(kk, M->KV * M->hd); TAKE(o, attn); TAKE(scores, M->max_seq);
    TAKE(hbuf, M->hada); TAKE(ap, d); TAKE(z, d); TAKE(mi, d); TAKE(mo, d); TAKE(y, d);
    TAKE(xn, n * d); TAKE(X, m * n * d); TAKE(ek, M->sites * m * d);
    TAKE(ev, M->sites * m * d); TAKE(e, m * M->T * M->sub); TAKE(kv, m * 2 * d);
    TAKE(xp, M->cq ? m * M->cq_max_in : 0); TAKE(tmp, M->cq ? M->cq_max_in : 0);
#undef TAKE
    return p;
}

int64_t nat_scratch_floats(const NModel *M, int64_t m)
{
    Scratch s;
    return carve(M, m, (float *)0, &s) - (float *)0;
}

/* ---- one layer ---- */

static void cap_put(float **cap, int idx, int64_t layer, const float *v, int64_t cnt)
{
    if (cap && cap[idx]) memcpy(cap[idx] + layer * cnt, v, (size_t)cnt * sizeof(float));
}

#ifdef NEEDLE_STAGE_CLOCK
double nat_stage_ns[ST_COUNT], nat_stage_mark;
#define NAT_SNAME(e, s) s,
static const char *const stage_names[] = {NAT_STAGES(NAT_SNAME)};
const char *nat_stage_name(int64_t i) { return i >= 0 && i < ST_COUNT ? stage_names[i] : 0; }
/* The nanoseconds each stage took since the last call (out[ST_COUNT]), then zeroed. */
void nat_stage_take(double *out)
{
    for (int k = 0; k < ST_COUNT; k++) out[k] = nat_stage_ns[k], nat_stage_ns[k] = 0.0;
}
#endif

int64_t nat_capture_count(void) { return C_COUNT; }
const char *nat_capture_name(int64_t i) { return i >= 0 && i < C_COUNT ? capture_names[i] : 0; }

/* sizeof the structs the ctypes mirrors lay out (0: NModel, 1: NState, 2: CqMat). */
int64_t nat_struct_size(int64_t which)
{
    return which == 0 ? (int64_t)sizeof(NModel) : which == 1 ? (int64_t)sizeof(NState)
         : which == 2 ? (int64_t)sizeof(CqMat) : -1;
}

/* o[t] += e_p * v_p[t] over the present keys p = lo..pos in order (e[p - lo] < 0: skipped).
   Each o[t] is its own chain of a product then a sum (no fusing), so keeping 32 or 64 of them
   in registers across the keys, rather than in memory, changes no bit. The ring slot steps
   instead of p % R (an integer division per key was a large part of the step). */
static void weigh_values(const float *e, int64_t lo, int64_t pos, const float *vb, int64_t R,
                         int64_t hd, float *o)
{
    int64_t t0 = 0, n = pos - lo + 1, sl0 = lo % R;
#ifdef __AVX__
    if (hd == 64) {
        __m256 a[8];
        for (int q = 0; q < 8; q++) a[q] = _mm256_loadu_ps(o + 8 * q);
        for (int64_t j = 0, sl = sl0; j < n; j++, sl = sl + 1 == R ? 0 : sl + 1) {
            if (e[j] < 0.0f) continue;
            const float *vr = vb + sl * hd;
            __m256 ew = _mm256_set1_ps(e[j]);
            for (int q = 0; q < 8; q++)
                a[q] = _mm256_add_ps(a[q], _mm256_mul_ps(ew, _mm256_loadu_ps(vr + 8 * q)));
        }
        for (int q = 0; q < 8; q++) _mm256_storeu_ps(o + 8 * q, a[q]);
        return;
    }
    for (; t0 + 32 <= hd; t0 += 32) {
        __m256 a[4];
        for (int q = 0; q < 4; q++) a[q] = _mm256_loadu_ps(o + t0 + 8 * q);
        for (int64_t j = 0, sl = sl0; j < n; j++, sl = sl + 1 == R ? 0 : sl + 1) {
            if (e[j] < 0.0f) continue;
            const float *vr = vb + sl * hd + t0;
            __m256 ew = _mm256_set1_ps(e[j]);
            for (int q = 0; q < 4; q++)
                a[q] = _mm256_add_ps(a[q], _mm256_mul_ps(ew, _mm256_loadu_ps(vr + 8 * q)));
        }
        for (int q = 0; q < 4; q++) _mm256_storeu_ps(o + t0 + 8 * q, a[q]);
    }
#endif
    for (int64_t j = 0, sl = sl0; j < n; j++, sl = sl + 1 == R ? 0 : sl + 1) {
        if (e[j] < 0.0f) continue;
        const float *vr = vb + sl * hd;
        for (int64_t t = t0; t < hd; t++) o[t] += e[j] * vr[t];
    }
}

/* Attention of one row at position `pos`: norms and RoPE, the ring write, then softmax over
   the window in position order (oldest first), skipping keys marked absent. */
static void attend_row(const NModel *M, NState *S, int64_t i, int64_t pos, uint8_t valid,
                       const float *qkvg, float *og, Scratch *s, float **cap, int first)
{
    int64_t H = M->H, KV = M->KV, hd = M->hd, attn = H * hd, kvd = KV * hd, R = S->R;
    int64_t half = hd / 2, rep = H / KV, slot = pos % R;
    int64_t rpos = pos;
#ifdef NEEDLE_FAULT_ROPE_POS_PLUS_1
    if (i == 3) rpos = (pos + 1) % M->max_seq;
#endif
    const float *c = M->cos_t + rpos * half, *sn = M->sin_t + rpos * half;
    for (int64_t hh = 0; hh < H; hh++) {
        zc(qkvg + hh * hd, M->qn + i * hd, hd, M->eps, s->q + hh * hd);
        rope(s->q + hh * hd, c, sn, hd);
    }
    for (int64_t g = 0; g < KV; g++) {
        zc(qkvg + attn + g * hd, M->kn + i * hd, hd, M->eps, s->kk + g * hd);
        rope(s->kk + g * hd, c, sn, hd);
        size_t at = (size_t)(((i * KV + g) * R + slot) * hd);
        memcpy(S->k + at, s->kk + g * hd, (size_t)hd * sizeof(float));
        memcpy(S->v + at, qkvg + attn + kvd + g * hd, (size_t)hd * sizeof(float));
    }
    S->key_ok[slot] = valid;
    int64_t win = S->window > 1 ? S->window - WINDOW_SHORT : S->window;
    int64_t lo = win ? pos - win + 1 : 0;
    if (lo < 0) lo = 0;
    for (int64_t hh = 0; hh < H; hh++) {
        int64_t g = hh / rep;
        const float *kb = S->k + (size_t)((i * KV + g) * R) * hd;
        const float *vb = S->v + (size_t)((i * KV + g) * R) * hd;
        float mx = -INFINITY, l = 0.0f, *o = s->o + hh * hd;
        int64_t p = lo, sl = lo % R;              /* sl: p's ring slot, stepped */
        for (; p + 4 <= pos + 1; p += 4) {       /* 4 keys a call: the same bits per key */
            const float *kp[4];
            int64_t sj[4];
            float d4[4];
            for (int j = 0; j < 4; j++, sl = sl + 1 == R ? 0 : sl + 1)
                sj[j] = sl, kp[j] = kb + sl * hd;
            nat_dot_head4(s->q + hh * hd, kp, hd, d4);
            for (int j = 0; j < 4; j++) {
#ifdef NEEDLE_FAULT_PAD_KEYS_ATTENDED
                float sc = d4[j] * M->attn_scale;
#else
                float sc = S->key_ok[sj[j]] ? d4[j] * M->attn_scale : -INFINITY;
#endif
                s->scores[p + j - lo] = sc;
                mx = sc > mx ? sc : mx;
            }
        }
        for (; p <= pos; p++, sl = sl + 1 == R ? 0 : sl + 1) {
#ifdef NEEDLE_FAULT_PAD_KEYS_ATTENDED
            float sc = 1
#else
            float sc = S->key_ok[sl]
#endif
                           ? nat_dot_head(s->q + hh * hd, kb + sl * hd, hd) * M->attn_scale
                           : -INFINITY;
            s->scores[p - lo] = sc;
            mx = sc > mx ? sc : mx;
        }
        memset(o, 0, (size_t)hd * sizeof(float));
        if (mx == -INFINITY) continue;          /* nothing to attend to: zeros, never NaN */
        for (int64_t p = lo; p <= pos; p++) {   /* weights first; -1 marks a skipped key */
            float sc = s->scores[p - lo];
            if (sc == -INFINITY) {
                s->scores[p - lo] = -1.0f;          /* expf is never negative (NaN passes) */
                continue;
            }
            float e = expf(sc - mx);
            l += e;
            s->scores[p - lo] = e;
        }
        weigh_values(s->scores, lo, pos, vb, R, hd, o);
        for (int64_t t = 0; t < hd; t++) o[t] /= l;
    }
    const float *graw = qkvg + attn + 2 * kvd;
#ifdef NEEDLE_FAULT_ATTN_GATE_SKIPPED
    for (int64_t t = 0; t < attn; t++) og[t] = s->o[t];
#else
    for (int64_t t = 0; t < attn; t++) og[t] = s->o[t] * sigmoidf_(graw[t]);
#endif
    if (first) {
        cap_put(cap, C_Q, i, s->q, attn); cap_put(cap, C_K, i, s->kk, kvd);
        cap_put(cap, C_V, i, qkvg + attn + kvd, kvd); cap_put(cap, C_ATTN, i, s->o, attn);
        if (cap && cap[C_GATE])
            for (int64_t t = 0; t < attn; t++) cap[C_GATE][i * attn + t] = sigmoidf_(graw[t]);
    }
}

static void layer(const NModel *M, NState *S, int64_t i, int64_t m, int64_t pos0, float *X,
                  const float *ek, const float *ev, const uint8_t *valid, Scratch *s,
                  float **cap)
{
    int64_t n = M->n, d = M->d, H = M->H, hd = M->hd, attn = H * hd, nd = n * d;
    int64_t nr = nr_of(M), nq = nq_of(M), hada = M->hada, site = M->site_of_layer[i];
    for (int64_t r = 0; r < m; r++) {
        float ri = rms_inv(X + r * nd, nd, M->eps);
        for (int64_t t = 0; t < nd; t++) s->nx[r * nd + t] = X[r * nd + t] * ri;
    }
    if (M->cq) nat_cq_product(M->cq_router + 3 * i, 3, s->nx, m, nd, s->r, nr, s->xp);
    else nat_gemm(s->nx, m, M->router + i * nr * nd, nr, nd, s->r);
    STAGE(ST_ROUTER);
    for (int64_t r = 0; r < m; r++) {
        const float *rr = s->r + r * nr, *Xr = X + r * nd;
        float *hpre = s->hpre + r * n, *u = s->u + r * d, *bx = s->bx + r * d;
        for (int64_t l = 0; l < n; l++)
            hpre[l] = sigmoidf_(M->a_pre[i] * rr[l] + M->pre_bias[i * n + l]);
        mix_lanes(hpre, n, Xr, d, d, u);
        s->alpha[r] = 0.0f;
        memcpy(bx, u, (size_t)d * sizeof(float));
        if (site >= 0) {
            const float *k = ek + (site * m + r) * d, *v = ev + (site * m + r) * d;
            float ru = rms_inv(u, d, M->eps), rk = rms_inv(k, d, M->eps), acc[32] = {0};
            for (int64_t t = 0; t < d; t++) acc[t % 32] += (u[t] * ru) * (k[t] * rk);
            float al = sigmoidf_(nat_tree32(acc) / sqrtf((float)d));
            s->alpha[r] = al;
            for (int64_t t = 0; t < d; t++) bx[t] = u[t] + al * v[t];
        }
        zc(bx, M->pre + i * d, d, M->eps, s->h + r * d);
        for (int64_t l = 0; l < n; l++)
            s->hpost[r * n + l] = HPOST_SCALE * sigmoidf_(M->a_post[i] * rr[n + l]
                                                   + M->post_bias[i * n + l]);
        float *res = s->res + r * n * n;
        for (int64_t t = 0; t < n * n; t++)
            res[t] = M->a_res[i] * rr[2 * n + t] + M->b_res[i * n * n + t];
        if (r == 0 && cap) {
            cap_put(cap, C_NX, i, s->nx, nd); cap_put(cap, C_HPRE, i, hpre, n);
            cap_put(cap, C_U, i, u, d); cap_put(cap, C_ALPHA, i, s->alpha, 1);
            cap_put(cap, C_BX, i, bx, d); cap_put(cap, C_H, i, s->h, d);
            cap_put(cap, C_HPOST, i, s->hpost, n); cap_put(cap, C_RES, i, res, n * n);
        }
        nat_sinkhorn(res, n, M->sinkhorn_iters - SINKHORN_SHORT);
        if (r == 0) cap_put(cap, C_HRES, i, res, n * n);
    }
    STAGE(ST_LANES);
    if (M->cq) nat_cq_product(M->cq_qkvg + 4 * i, 4, s->h, m, d, s->qkvg, nq, s->xp);
    else nat_gemm(s->h, m, M->qkvg + i * nq * d, nq, d, s->qkvg);
    STAGE(ST_QKVG);
    for (int64_t r = 0; r < m; r++)          /* in order: row r reads the rows before it */
        attend_row(M, S, i, pos0 + r, valid[r], s->qkvg + r * nq, s->og + r * attn, s, cap,
                   r == 0);
    STAGE(ST_ATTN);
    if (M->cq) nat_cq_product(M->cq_out + i, 1, s->og, m, attn, s->a, d, s->xp);
    else nat_gemm(s->og, m, M->out + i * d * attn, d, attn, s->a);
    STAGE(ST_OUT);
    for (int64_t r = 0; r < m; r++) {
        const float *a = s->a + r * d, *bx = s->bx + r * d, *u = s->u + r * d;
        float *Xr = X + r * nd;
        zc(a, M->post + i * d, d, M->eps, s->ap);
#ifdef NEEDLE_FAULT_RESIDUAL_GATE_SKIPPED
        for (int64_t t = 0; t < d; t++) s->z[t] = bx[t] + s->ap[t];
#else
        for (int64_t t = 0; t < d; t++) s->z[t] = bx[t] + M->attn_gate[i] * s->ap[t];
#endif
        zc(s->z, M->pre_hada + i * d, d, M->eps, s->mi);
        const float *d1 = M->d1 + i * hada, *d2 = M->d2 + i * hada, *d3 = M->d3 + i * hada;
        for (int64_t t = 0; t < hada; t++) s->hbuf[t] = t < d ? d1[t] * s->mi[t] : 0.0f;
        nat_fwht(s->hbuf, hada, M->walsh_scale);
        for (int64_t t = 0; t < hada; t++) {
            float e = d2[t] * s->hbuf[t];
            s->hbuf[t] = e / (1.0f + expf(-e));
        }
        nat_fwht(s->hbuf, hada, M->walsh_scale);
        for (int64_t t = 0; t < d; t++) s->mo[t] = d3[t] * s->hbuf[t];
#ifdef NEEDLE_FAULT_Y_MINUS_BX
        for (int64_t t = 0; t < d; t++) s->y[t] = s->z[t] + s->mo[t] - bx[t];
#else
        for (int64_t t = 0; t < d; t++) s->y[t] = s->z[t] + s->mo[t] - u[t];
#endif
        const float *P = s->res + r * n * n, *hpost = s->hpost + r * n;
        for (int64_t l = 0; l < n; l++) {
            float *xl = s->xn + l * d;
            mix_lanes(P + l * n, n, Xr, d, d, xl);
            for (int64_t t = 0; t < d; t++) xl[t] = xl[t] + hpost[l] * s->y[t];
        }
        if (r == 0 && cap) {
            cap_put(cap, C_AOUT, i, a, d); cap_put(cap, C_APOST, i, s->ap, d);
            cap_put(cap, C_MI, i, s->mi, d); cap_put(cap, C_MO, i, s->mo, d);
            float *blk = s->hbuf;                 /* free again: z + mo for the trace */
            for (int64_t t = 0; t < d; t++) blk[t] = s->z[t] + s->mo[t];
            cap_put(cap, C_BLOCK, i, blk, d); cap_put(cap, C_Y, i, s->y, d);
            cap_put(cap, C_X, i, s->xn, nd);
        }
        memcpy(Xr, s->xn, (size_t)nd * sizeof(float));
    }
    STAGE(ST_MLP);
}

/* Engram keys and convolved values of every site for m rows: the gathered table rows (an
   n-gram whose oldest token is absent contributes zeros), one key|value product for the
   chunk, then row by row the value ring write and the dilated taps over present rows (a
   row's taps read the rows before it, so the ring is written in order). */
static void engram(const NModel *M, NState *S, int64_t m, int64_t pos0, const int64_t *flat,
                   const float *ok, const uint8_t *tap_ok, Scratch *s, float **cap)
{
    int64_t d = M->d, T = M->T, sub = M->sub, Re = M->ering;
    for (int64_t st = 0; st < M->sites; st++) {
        for (int64_t r = 0; r < m; r++)
            for (int64_t t = 0; t < T; t++) {
                float *e = s->e + (r * T + t) * sub, f = ok[r * T + t];
                const float *row = e;
                if (M->cq) nat_cq_row(M->cq_tables + st, flat[r * T + t], e, s->tmp);
                else row = M->tables[st] + flat[r * T + t] * sub;
                for (int64_t c = 0; c < sub; c++) e[c] = row[c] * f;
            }
        if (M->cq) nat_cq_product(M->cq_eng_kv + 2 * st, 2, s->e, m, T * sub, s->kv, 2 * d,
                                  s->xp);
        else nat_gemm(s->e, m, M->eng_kv[st], 2 * d, T * sub, s->kv);
        for (int64_t r = 0; r < m; r++) {
            int64_t p = pos0 + r;
            const float *kv = s->kv + r * 2 * d;
            float *k = s->ek + (st * m + r) * d, *v = s->ev + (st * m + r) * d;
            memcpy(k, kv, (size_t)d * sizeof(float));
            memcpy(S->vraw + (st * Re + p % Re) * d, kv + d, (size_t)d * sizeof(float));
            memset(v, 0, (size_t)d * sizeof(float));
            for (int64_t j = 0; j < M->taps; j++) {
                if (!tap_ok[r * M->taps + j]) continue;
                const float *src = S->vraw + (st * Re + (p - j * M->dil) % Re) * d;
                const float *tp = M->eng_taps[st] + j * d;
                for (int64_t c = 0; c < d; c++) v[c] = v[c] + tp[c] * src[c];
            }
            if (r == 0) {
                cap_put(cap, C_EK, st, k, d);
                cap_put(cap, C_EV, st, v, d);
            }
        }
    }
}

/* Rows for the tokens tok[0..m-1] at positions pos0..: embedding, Engram (flat table rows
   [m, T], their presence [m, T], tap presence [m, taps], key presence [m]: the host's n-gram
   hashes and validity bits), every layer, then the last row's lanes, the final norm and
   (want_logits) the LM head into `logits`. Returns 0, or -1 for positions past max_seq or
   a token outside the vocabulary (nothing written then). */
int64_t nat_rows(const NModel *M, NState *S, int64_t m, int64_t pos0, const int64_t *tok,
                 const int64_t *flat, const float *ok, const uint8_t *tap_ok,
                 const uint8_t *valid, float *scratch, float **cap, int64_t want_logits,
                 float *logits)
{
    if (m < 1 || pos0 < 0 || pos0 + m > M->max_seq) return -1;
    for (int64_t r = 0; r < m; r++)
        if (tok[r] < 0 || tok[r] >= M->vocab) return -1;
    Scratch s;
    carve(M, m, scratch, &s);
    STAGE_START();
    float sq = (float)sqrt((double)M->d);
    for (int64_t r = 0; r < m; r++) {
        const float *row = s.tmp;
        if (M->cq) nat_cq_row(M->cq_emb, tok[r], s.z, s.tmp), row = s.z;
        else row = M->emb + tok[r] * M->d;
        for (int64_t l = 0; l < M->n; l++)
            for (int64_t t = 0; t < M->d; t++)
                s.X[(r * M->n + l) * M->d + t] = row[t] * sq;
    }
    cap_put(cap, C_EMBED, 0, s.X, M->d);
    STAGE(ST_EMBED);
    engram(M, S, m, pos0, flat, ok, tap_ok, &s, cap);
    STAGE(ST_ENGRAM);
    float *X = s.X;
    for (int64_t i = 0; i < M->L; i++)
        layer(M, S, i, m, pos0, X, s.ek, s.ev, valid, &s, cap);
    int64_t n = M->n, d = M->d;
    const float *last = X + (m - 1) * n * d;
    memcpy(S->lanes, last, (size_t)(n * d) * sizeof(float));
    for (int64_t t = 0; t < d; t++) {
        float acc = 0.0f;
        for (int64_t l = 0; l < n; l++) acc += last[l * d + t];
        s.z[t] = acc / (float)n;
    }
    float ri = rms_inv(s.z, d, M->eps);
    for (int64_t t = 0; t < d; t++) S->hidden[t] = (1.0f + M->final_scale[t]) * (s.z[t] * ri);
    cap_put(cap, C_MEAN, 0, s.z, d);
    if (want_logits && M->cq)
        nat_cq_product(M->cq_emb, 1, S->hidden, 1, d, logits, M->vocab, s.xp);
    else if (want_logits)
        nat_gemm(S->hidden, 1, M->emb, M->vocab, d, logits);
    STAGE(ST_HEAD);
    return 0;
}

/* Injection (ladder/engine/locate.py): layer i alone at position `pos` on `lanes` [n, d] (replaced by
   the layer's output), over the same scratch and ring as nat_rows. The Engram keys and values
   of every site at pos come in ek/ev [sites, d]; with ek NULL they are computed here from the
   host arrays of that position (flat, ok, tap_ok as for nat_rows with m = 1, which rewrites
   the value ring's row of pos). Writes layer i's K/V at pos. Returns 0, or -1 for a layer or
   position out of range (nothing written then). */
int64_t nat_layer(const NModel *M, NState *S, int64_t i, int64_t pos, float *lanes,
                  const float *ek, const float *ev, const int64_t *flat, const float *ok,
                  const uint8_t *tap_ok, uint8_t valid, float *scratch, float **cap)
{
    if (i < 0 || i >= M->L || pos < 0 || pos >= M->max_seq) return -1;
    Scratch s;
    carve(M, 1, scratch, &s);
    STAGE_START();
    if (!ek) {
        engram(M, S, 1, pos, flat, ok, tap_ok, &s, 0);
        ek = s.ek;
        ev = s.ev;
    }
    layer(M, S, i, 1, pos, lanes, ek, ev, &valid, &s, cap);
    return 0;
}
