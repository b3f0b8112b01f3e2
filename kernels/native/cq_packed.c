/* Cactus-Quants products straight from the packed codes (the native twin of CqWeight):

       y[o] = sum_j w[o, j] * xp[j],   w[o, j] = level[code(o, j)] * norm[o, j / 128],
       xp = the input zero-padded to in_pad and Walsh-rotated per 128-group.

   Blocks of ROWS weight rows are decoded into an L1/L2-sized scratch (one multiply per
   weight, the same float32 product CqWeight's dense form stores) and every input row is
   dotted with them by nat_gemm_block. So the codes (12.9 MB for the shipped model, in the
   last-level cache) replace 137 MB of float32 streamed from memory; a prefill chunk decodes
   each block once for all its rows; and the result is bit-identical to nat_gemm over the
   decoded matrix, whatever the batch, the thread count or the vector width. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "native.h"

#define GROUP 128
#define ROWS 16
#define MAX_IN 4096                   /* widest padded input (kernels/native MAX_IN) */

static const float H128 = 0.08838834764831845f;     /* 1/sqrt(128), rounded once to f32 */

void nat_cq_rotate(const float *x, int64_t K, int64_t in_pad, float *xp)
{
    memcpy(xp, x, (size_t)K * sizeof(float));
    memset(xp + K, 0, (size_t)(in_pad - K) * sizeof(float));
    for (int64_t g = 0; g < in_pad; g += GROUP) nat_fwht(xp + g, GROUP, H128);
}

static unsigned code_at(const uint8_t *codes, int64_t j, int64_t bits)
{
    int64_t bit = j * bits;
    unsigned word = codes[bit >> 3];
    if ((bit & 7) + bits > 8) word |= (unsigned)codes[(bit >> 3) + 1] << 8;
    return (word >> (bit & 7)) & ((1u << bits) - 1);
}

#ifdef __AVX2__
/* The 8 codes starting at byte c: 2 whole bytes (2-bit) or 4 (4-bit). */
static inline uint32_t codes8(const uint8_t *c, int wide)
{
    uint32_t word;
    uint16_t half;
    if (wide) {
        memcpy(&word, c, 4);                       /* constant-size loads: no calls */
        return word;
    }
    memcpy(&half, c, 2);
    return half;
}

static inline __m256i shifts(int wide)
{
    return wide ? _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)
                : _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
}

/* 8 codes of `bits` (2 or 4) packed in `word` -> their levels times `nrm`. */
static inline __m256 decode8(uint32_t word, __m256i sh, __m256i mask, __m256 lo, __m256 hi,
                             int wide, __m256 nrm)
{
    __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)word), sh), mask);
    __m256 v = _mm256_permutevar8x32_ps(lo, idx);
    if (wide)
        v = _mm256_blendv_ps(v, _mm256_permutevar8x32_ps(hi, idx),
                             _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(7))));
    return _mm256_mul_ps(v, nrm);
}
#endif

/* w[j] = levels[code j] * norm of j's group, for one row. */
static void decode_row(const CqMat *A, int64_t o, float *w)
{
    const int64_t bits = A->bits, in_pad = A->in_pad;
    const uint8_t *codes = A->packed + o * A->row_bytes;
    const float *norm = A->norms + o * (in_pad / GROUP), *lev = A->levels;
    int64_t j = 0;
#ifdef __AVX2__
    if (bits == 2 || bits == 4) {
        const int wide = bits == 4;
        const __m256 lo = _mm256_loadu_ps(lev), hi = _mm256_loadu_ps(lev + 8);
        const __m256i sh = shifts(wide), mask = _mm256_set1_epi32((1 << bits) - 1);
        for (int64_t g = 0; g < in_pad / GROUP; g++) {
            const __m256 nrm = _mm256_set1_ps(norm[g]);
            for (int64_t k = g * GROUP; k < (g + 1) * GROUP; k += 8)
                _mm256_storeu_ps(w + k, decode8(codes8(codes + k * bits / 8, wide), sh, mask,
                                                lo, hi, wide, nrm));
        }
        return;
    }
#endif
    for (; j < in_pad; j++) w[j] = lev[code_at(codes, j, bits)] * norm[j / GROUP];
}

#if defined(__AVX2__) && defined(__FMA__)
#define FUSED 1
/* nat_dot(xp, decoded row o) without storing the row (a one-token step): the same lanes
   (four chains of 8, k in 32-blocks), the same fused multiply-adds, the same tree, and the
   same weights: a group's table holds level[c] * norm, the product decode8 forms per weight.

   A one-token step is bound by the decode, not by the loads, so the inner loops are cut to
   a few instructions per 8 weights: vpermilps reads only an index's low 2 bits and picks
   within each 128-bit half, so a 2-bit table held in both halves needs no mask and no
   cross-lane vpermps (one cheaper shuffle per 8 weights; the same value is picked); a 4-bit
   code's low 3 bits pick with vpermps from each 8-entry half and its top bit, shifted to the
   sign, picks between them (vblendvps reads only the sign). One 32-bit load
   feeds 16 2-bit codes or 8 4-bit ones. */
static inline float tree_regs(__m256 c0, __m256 c1, __m256 c2, __m256 c3)
{
    /* nat_tree32 on the four chains held in registers: the same adds in the same order */
    __m256 v = _mm256_add_ps(_mm256_add_ps(c0, c2), _mm256_add_ps(c1, c3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

static inline __m256 bcast32(const uint8_t *c)
{
    uint32_t w;
    memcpy(&w, c, 4);
    return _mm256_castsi256_ps(_mm256_set1_epi32((int)w));
}

static float fused_row2(const CqMat *A, int64_t o, const float *xp)
{
    const int64_t groups = A->in_pad / GROUP;
    const uint8_t *codes = A->packed + o * A->row_bytes;
    const float *norm = A->norms + o * groups;
    const __m256 lev = _mm256_permutevar8x32_ps(_mm256_loadu_ps(A->levels),
                                                _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3));
    const __m256i sh0 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
                  sh1 = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t g = 0; g < groups; g++, codes += GROUP / 4, xp += GROUP) {
        const __m256 t = _mm256_mul_ps(lev, _mm256_set1_ps(norm[g]));
        for (int k = 0; k < GROUP; k += 32) {
            __m256i a = _mm256_castps_si256(bcast32(codes + k / 4)),
                    b = _mm256_castps_si256(bcast32(codes + k / 4 + 4));
            c0 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + k),
                                 _mm256_permutevar_ps(t, _mm256_srlv_epi32(a, sh0)), c0);
            c1 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + k + 8),
                                 _mm256_permutevar_ps(t, _mm256_srlv_epi32(a, sh1)), c1);
            c2 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + k + 16),
                                 _mm256_permutevar_ps(t, _mm256_srlv_epi32(b, sh0)), c2);
            c3 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + k + 24),
                                 _mm256_permutevar_ps(t, _mm256_srlv_epi32(b, sh1)), c3);
        }
    }
    return tree_regs(c0, c1, c2, c3);
}

/* fused_row2 of rows o and o + 1 together: 8 independent chains keep both FMA pipes busy
   (4 chains of one row wait on the FMA latency); each row's chains and tree are its own. */
static void fused_rows2x2(const CqMat *A, int64_t o, const float *xp, float *y)
{
    const int64_t groups = A->in_pad / GROUP;
    const uint8_t *ca = A->packed + o * A->row_bytes, *cb = ca + A->row_bytes;
    const float *na = A->norms + o * groups, *nb = na + groups;
    const __m256 lev = _mm256_permutevar8x32_ps(_mm256_loadu_ps(A->levels),
                                                _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3));
    const __m256i sh0 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
                  sh1 = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0,
           b3 = a0;
    for (int64_t g = 0; g < groups; g++, ca += GROUP / 4, cb += GROUP / 4, xp += GROUP) {
        const __m256 ta = _mm256_mul_ps(lev, _mm256_set1_ps(na[g])),
                     tb = _mm256_mul_ps(lev, _mm256_set1_ps(nb[g]));
        for (int k = 0; k < GROUP; k += 32) {
            const __m256 x0 = _mm256_loadu_ps(xp + k), x1 = _mm256_loadu_ps(xp + k + 8),
                         x2 = _mm256_loadu_ps(xp + k + 16), x3 = _mm256_loadu_ps(xp + k + 24);
            __m256i u = _mm256_castps_si256(bcast32(ca + k / 4)),
                    v = _mm256_castps_si256(bcast32(ca + k / 4 + 4));
            a0 = _mm256_fmadd_ps(x0, _mm256_permutevar_ps(ta, _mm256_srlv_epi32(u, sh0)), a0);
            a1 = _mm256_fmadd_ps(x1, _mm256_permutevar_ps(ta, _mm256_srlv_epi32(u, sh1)), a1);
            a2 = _mm256_fmadd_ps(x2, _mm256_permutevar_ps(ta, _mm256_srlv_epi32(v, sh0)), a2);
            a3 = _mm256_fmadd_ps(x3, _mm256_permutevar_ps(ta, _mm256_srlv_epi32(v, sh1)), a3);
            u = _mm256_castps_si256(bcast32(cb + k / 4));
            v = _mm256_castps_si256(bcast32(cb + k / 4 + 4));
            b0 = _mm256_fmadd_ps(x0, _mm256_permutevar_ps(tb, _mm256_srlv_epi32(u, sh0)), b0);
            b1 = _mm256_fmadd_ps(x1, _mm256_permutevar_ps(tb, _mm256_srlv_epi32(u, sh1)), b1);
            b2 = _mm256_fmadd_ps(x2, _mm256_permutevar_ps(tb, _mm256_srlv_epi32(v, sh0)), b2);
            b3 = _mm256_fmadd_ps(x3, _mm256_permutevar_ps(tb, _mm256_srlv_epi32(v, sh1)), b3);
        }
    }
    y[0] = tree_regs(a0, a1, a2, a3);
    y[1] = tree_regs(b0, b1, b2, b3);
}

static inline __m256 pick4(__m256i word, __m256i shr, __m256i shl, __m256 tlo, __m256 thi)
{
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(tlo, _mm256_srlv_epi32(word, shr)),
                            _mm256_permutevar8x32_ps(thi, _mm256_srlv_epi32(word, shr)),
                            _mm256_castsi256_ps(_mm256_sllv_epi32(word, shl)));
}

static float fused_row4(const CqMat *A, int64_t o, const float *xp)
{
    const int64_t groups = A->in_pad / GROUP;
    const uint8_t *codes = A->packed + o * A->row_bytes;
    const float *norm = A->norms + o * groups;
    const __m256 lo = _mm256_loadu_ps(A->levels), hi = _mm256_loadu_ps(A->levels + 8);
    const __m256i shr = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
                  shl = _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0);
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t g = 0; g < groups; g++, codes += GROUP / 2, xp += GROUP) {
        const __m256 nrm = _mm256_set1_ps(norm[g]);
        const __m256 tlo = _mm256_mul_ps(lo, nrm), thi = _mm256_mul_ps(hi, nrm);
        for (int k = 0; k < GROUP; k += 32) {
            const uint8_t *c = codes + k / 2;
            c0 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + k), pick4(_mm256_castps_si256(
                     bcast32(c)), shr, shl, tlo, thi), c0);
            c1 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + k + 8), pick4(_mm256_castps_si256(
                     bcast32(c + 4)), shr, shl, tlo, thi), c1);
            c2 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + k + 16), pick4(_mm256_castps_si256(
                     bcast32(c + 8)), shr, shl, tlo, thi), c2);
            c3 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + k + 24), pick4(_mm256_castps_si256(
                     bcast32(c + 12)), shr, shl, tlo, thi), c3);
        }
    }
    return tree_regs(c0, c1, c2, c3);
}
#endif

void nat_cq_product(const CqMat *mats, int64_t nmats, const float *x, int64_t M, int64_t K,
                    float *y, int64_t ldy, float *xp)
{
    int64_t in_pad = mats[0].in_pad, col = 0, fusable = M == 1;
    for (int64_t r = 0; r < M; r++) nat_cq_rotate(x + r * K, K, in_pad, xp + r * in_pad);
    for (int64_t i = 0; i < nmats; i++) fusable &= mats[i].bits == 2 || mats[i].bits == 4;
    for (int64_t i = 0; i < nmats; i++) {
        const CqMat *A = mats + i;
#if defined(FUSED) && defined(__AVX512F__)
        if (fusable) {                   /* one token, 16 lanes a vector: cq_wide.c */
            const float *xq = xp;
            float perm[MAX_IN];
            if (A->bits == 4) nat_cq_wide_perm(xp, in_pad, perm), xq = perm;
#pragma omp parallel for schedule(static) num_threads(nat_threads) \
    if (nat_threads > 1 && A->rows >= 4 * ROWS)
            for (int64_t o = 0; o < A->rows; o += 2) {
                int64_t nr = o + 1 < A->rows ? 2 : 1;
                if (A->bits == 4) nat_cq_wide_rows4(A, o, nr, xq, y + col + o);
                else if (nr == 2) nat_cq_wide_rows2(A, o, xp, y + col + o);
                else y[col + o] = fused_row2(A, o, xp);
            }
            col += A->rows;
            continue;
        }
#elif defined(FUSED)
        if (fusable) {                   /* one token: decode straight into the dot */
#pragma omp parallel for schedule(static) num_threads(nat_threads) \
    if (nat_threads > 1 && A->rows >= 4 * ROWS)
            for (int64_t o = 0; o < A->rows; o += 2) {
                if (A->bits == 2 && o + 1 < A->rows) fused_rows2x2(A, o, xp, y + col + o);
                else if (A->bits == 2) y[col + o] = fused_row2(A, o, xp);
                else {
                    y[col + o] = fused_row4(A, o, xp);
                    if (o + 1 < A->rows) y[col + o + 1] = fused_row4(A, o + 1, xp);
                }
            }
            col += A->rows;
            continue;
        }
#endif
        /* a chunk: decode a block of rows once for all its inputs; row blocks split across
           threads (a value's arithmetic does not depend on the split) */
#pragma omp parallel for schedule(static) num_threads(nat_threads) \
    if (nat_threads > 1 && A->rows >= 4 * ROWS)
        for (int64_t o0 = 0; o0 < A->rows; o0 += ROWS) {
            float w[ROWS * MAX_IN];
            int64_t nr = o0 + ROWS < A->rows ? ROWS : A->rows - o0;
            for (int64_t o = 0; o < nr; o++) decode_row(A, o0 + o, w + o * in_pad);
            nat_gemm_block(xp, M, in_pad, w, nr, in_pad, y + col + o0, ldy);
        }
        col += A->rows;
    }
}

void nat_cq_row(const CqMat *A, int64_t r, float *out, float *tmp)
{
    decode_row(A, r, tmp);
    for (int64_t g = 0; g < A->in_pad; g += GROUP) nat_fwht(tmp + g, GROUP, H128);
    memcpy(out, tmp, (size_t)A->in_features * sizeof(float));
}
