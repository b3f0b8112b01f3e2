/* The one-token Cactus-Quants rows of cq_packed.c (fused_rows2x2, fused_row4) with AVX-512:
   16 weights a vector instead of 8, so fewer instructions per weight on a step that is bound
   by decoding the codes (issue 48). Every output keeps the AVX2 kernels' arithmetic: lane j
   of the 32-lane accumulator sums x[k] * w[k] over k = j mod 32 in increasing k with one fused
   multiply-add each, the weights are the same products level * norm, and the same tree
   (nat_tree32's adds) joins the lanes. Only which register holds which lane changes.

   2-bit: one 32-bit load holds 16 codes; a variable shift puts code l in lane l's low bits,
   vpermilps picks from the 4-entry table copied into every 128-bit lane (it reads only those
   2 bits). The zmm pair [c0|c1], [c2|c3] is the AVX2 kernel's four ymm chains.
   4-bit: one 64-bit load holds 16 codes; shifting qword i right by 4i leaves code i in dword
   lane 2i and code 8 + i in lane 2i + 1, so vpermps over the 16-entry table picks them with
   no mask and no blend. The lanes are then in the order P(l) = l / 2 + 8 (l % 2) within each
   16: the input is permuted the same way once per product (nat_cq_wide_perm), and the
   accumulator is put back in lane order before the tree. */
#include <stdint.h>
#include <string.h>

#include "native.h"

#ifdef __AVX512F__
#include <immintrin.h>

#define GROUP 128

static inline __m512 bcast_codes32(const uint8_t *c)
{
    uint32_t w;
    memcpy(&w, c, 4);
    return _mm512_castsi512_ps(_mm512_set1_epi32((int)w));
}

static inline long long load64(const uint8_t *c)
{
    long long w;
    memcpy(&w, c, 8);
    return w;
}

/* tree_regs of cq_packed.c on [c0|c1] and [c2|c3]: (c0 + c2) + (c1 + c3), then halves. */
static inline float tree_pair(__m512 a, __m512 b)
{
    __m512 s = _mm512_add_ps(a, b);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1));
    __m256 v = _mm256_add_ps(_mm512_castps512_ps256(s), hi);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

/* Rows o and o + 1 of a 2-bit matrix: y[0], y[1] (fused_rows2x2's values). */
void nat_cq_wide_rows2(const CqMat *A, int64_t o, const float *xp, float *y)
{
    const int64_t groups = A->in_pad / GROUP;
    const uint8_t *ca = A->packed + o * A->row_bytes, *cb = ca + A->row_bytes;
    const float *na = A->norms + o * groups, *nb = na + groups;
    const __m512 lev = _mm512_broadcast_f32x4(_mm_loadu_ps(A->levels));
    const __m512i sh = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                         28, 30);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    for (int64_t g = 0; g < groups; g++, ca += GROUP / 4, cb += GROUP / 4, xp += GROUP) {
        const __m512 ta = _mm512_mul_ps(lev, _mm512_set1_ps(na[g])),
                     tb = _mm512_mul_ps(lev, _mm512_set1_ps(nb[g]));
        for (int k = 0; k < GROUP; k += 32) {
            const __m512 x0 = _mm512_loadu_ps(xp + k), x1 = _mm512_loadu_ps(xp + k + 16);
#define PICK2(t, c) _mm512_permutevar_ps(t, _mm512_srlv_epi32(_mm512_castps_si512( \
                        bcast_codes32(c)), sh))
            a0 = _mm512_fmadd_ps(x0, PICK2(ta, ca + k / 4), a0);
            a1 = _mm512_fmadd_ps(x1, PICK2(ta, ca + k / 4 + 4), a1);
            b0 = _mm512_fmadd_ps(x0, PICK2(tb, cb + k / 4), b0);
            b1 = _mm512_fmadd_ps(x1, PICK2(tb, cb + k / 4 + 4), b1);
#undef PICK2
        }
    }
    y[0] = tree_pair(a0, a1);
    y[1] = tree_pair(b0, b1);
}

/* xq = xp with every 16 values in the order P (see above): xq[16b + l] = xp[16b + P(l)]. */
void nat_cq_wide_perm(const float *xp, int64_t in_pad, float *xq)
{
    const __m512i p = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    for (int64_t k = 0; k < in_pad; k += 16)
        _mm512_storeu_ps(xq + k, _mm512_permutexvar_ps(p, _mm512_loadu_ps(xp + k)));
}

/* The accumulator [32] in lane order from the permuted pair, then nat_tree32. */
static float tree_perm(__m512 a, __m512 b)
{
    float t[32], acc[32];
    _mm512_storeu_ps(t, a);
    _mm512_storeu_ps(t + 16, b);
    for (int l = 0; l < 16; l++) {
        acc[l / 2 + 8 * (l % 2)] = t[l];
        acc[16 + l / 2 + 8 * (l % 2)] = t[16 + l];
    }
    return nat_tree32(acc);
}

/* Rows o .. o + nr - 1 (nr 1 or 2) of a 4-bit matrix on the permuted input xq. */
void nat_cq_wide_rows4(const CqMat *A, int64_t o, int64_t nr, const float *xq, float *y)
{
    const int64_t groups = A->in_pad / GROUP;
    const uint8_t *ca = A->packed + o * A->row_bytes;
    const uint8_t *cb = nr > 1 ? ca + A->row_bytes : ca;      /* one row: computed twice */
    const float *na = A->norms + o * groups, *nb = nr > 1 ? na + groups : na;
    const __m512 lev = _mm512_loadu_ps(A->levels);
    const __m512i sh = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    for (int64_t g = 0; g < groups; g++, ca += GROUP / 2, cb += GROUP / 2, xq += GROUP) {
        const __m512 ta = _mm512_mul_ps(lev, _mm512_set1_ps(na[g])),
                     tb = _mm512_mul_ps(lev, _mm512_set1_ps(nb[g]));
        for (int k = 0; k < GROUP; k += 32) {
            const __m512 x0 = _mm512_loadu_ps(xq + k), x1 = _mm512_loadu_ps(xq + k + 16);
#define PICK4(t, c) _mm512_permutexvar_ps(_mm512_srlv_epi64(_mm512_set1_epi64( \
                        load64(c)), sh), t)
            a0 = _mm512_fmadd_ps(x0, PICK4(ta, ca + k / 2), a0);
            a1 = _mm512_fmadd_ps(x1, PICK4(ta, ca + k / 2 + 8), a1);
            b0 = _mm512_fmadd_ps(x0, PICK4(tb, cb + k / 2), b0);
            b1 = _mm512_fmadd_ps(x1, PICK4(tb, cb + k / 2 + 8), b1);
#undef PICK4
        }
    }
    y[0] = tree_perm(a0, a1);
    if (nr > 1) y[1] = tree_perm(b0, b1);
}
#endif
