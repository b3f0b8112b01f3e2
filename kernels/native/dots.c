/* The dot products of the native step: every product of a weight matrix (nat_dot, dot2,
   tile43 and nat_gemm all give a pair (x row, weight row) the same bits) and the attention's
   head-sized dots.

   Each lane of a dot is a chain of fused multiply-adds (fmaf: one rounding, the same op in the
   AVX2 path and the scalar one) over k = lane mod 32 in increasing order, and a fixed tree adds
   the 32 lanes. So a row's result does not depend on how many rows share the call, on the
   thread split, nor on the vector width (tests/test_native.py checks all three). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "native.h"

#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#define NAT_SIMD 1
#endif

#define LANES 32           /* four 8-wide accumulator chains: add latency hidden */

/* Lane j of the accumulator sums a[k] * b[k] for k = j mod LANES in increasing k (one fused
   multiply-add each), then a fixed tree adds the lanes. dot2 does exactly this for two rows
   sharing b's loads, so every product in this file has the same bits however it is batched. */
float nat_tree32(const float *acc)
{
#ifdef NAT_SIMD
    /* lanes j and j+16, then j and j+8, then within 8 lanes: the scalar tree's order */
    __m256 v = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(acc), _mm256_loadu_ps(acc + 16)),
                             _mm256_add_ps(_mm256_loadu_ps(acc + 8), _mm256_loadu_ps(acc + 24)));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
#else
    float t[LANES];
    memcpy(t, acc, sizeof t);
    for (int s = LANES / 2; s; s >>= 1)
        for (int j = 0; j < s; j++) t[j] += t[j + s];
    return t[0];
#endif
}

static float reduce(float *acc, const float *a, const float *b, int64_t k, int64_t K)
{
    for (int j = 0; k + j < K; j++) acc[j] = fmaf(a[k + j], b[k + j], acc[j]);
    return nat_tree32(acc);
}

float nat_dot(const float *a, const float *b, int64_t K)
{
    float acc[LANES] = {0};
    int64_t k = 0;
#ifdef NAT_SIMD
    __m256 c[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    for (; k + LANES <= K; k += LANES)
        for (int q = 0; q < 4; q++)
            c[q] = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8 * q),
                                   _mm256_loadu_ps(b + k + 8 * q), c[q]);
    for (int q = 0; q < 4; q++) _mm256_storeu_ps(acc + 8 * q, c[q]);
#else
    for (; k + LANES <= K; k += LANES)
        for (int j = 0; j < LANES; j++) acc[j] = fmaf(a[k + j], b[k + j], acc[j]);
#endif
    return reduce(acc, a, b, k, K);
}

/* A head-sized dot (attention scores): two 8-lane chains (k mod 16), then a fixed tree.
   Its own arithmetic, the same for every key and position (ring == full cache). */
float nat_dot_head(const float *a, const float *b, int64_t K)
{
    float acc[16] = {0};
    int64_t k = 0;
#ifdef NAT_SIMD
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps();
    for (; k + 16 <= K; k += 16) {
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), c0);
        c1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), c1);
    }
    if (k == K) {                                   /* tree: 16 -> 8 -> 4 -> 2 -> 1 */
        __m256 v = _mm256_add_ps(c0, c1);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
        return _mm_cvtss_f32(h);
    }
    _mm256_storeu_ps(acc, c0);
    _mm256_storeu_ps(acc + 8, c1);
#endif
    for (; k + 16 <= K; k += 16)
        for (int j = 0; j < 16; j++) acc[j] = fmaf(a[k + j], b[k + j], acc[j]);
    for (int j = 0; k + j < K; j++) acc[j] = fmaf(a[k + j], b[k + j], acc[j]);
    for (int s = 8; s; s >>= 1)
        for (int j = 0; j < s; j++) acc[j] += acc[j + s];
    return acc[0];
}

/* nat_dot_head of one query with 4 keys: out[j] = nat_dot_head(a, b[j], K), the same chains
   and the same tree per key (the trees of 4 keys share the shuffles, one key per 128-bit
   half or per element, each add the one nat_dot_head makes). */
void nat_dot_head4(const float *a, const float *const b[4], int64_t K, float *out)
{
#ifdef NAT_SIMD
    if (K % 16 == 0) {
        __m256 c0[4], c1[4];
        for (int j = 0; j < 4; j++) c0[j] = c1[j] = _mm256_setzero_ps();
        for (int64_t k = 0; k < K; k += 16) {
            __m256 a0 = _mm256_loadu_ps(a + k), a1 = _mm256_loadu_ps(a + k + 8);
            for (int j = 0; j < 4; j++) {
                c0[j] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b[j] + k), c0[j]);
                c1[j] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(b[j] + k + 8), c1[j]);
            }
        }
        __m256 v[4];
        for (int j = 0; j < 4; j++) v[j] = _mm256_add_ps(c0[j], c1[j]);
        /* [lo(v0) + hi(v0) | lo(v1) + hi(v1)]: nat_dot_head's 8 -> 4 for two keys */
        __m256 u01 = _mm256_add_ps(_mm256_permute2f128_ps(v[0], v[1], 0x20),
                                   _mm256_permute2f128_ps(v[0], v[1], 0x31));
        __m256 u23 = _mm256_add_ps(_mm256_permute2f128_ps(v[2], v[3], 0x20),
                                   _mm256_permute2f128_ps(v[2], v[3], 0x31));
        /* 4 -> 2 (h + movehl(h)), then 2 -> 1 (h0 + h1), per half */
        u01 = _mm256_add_ps(u01, _mm256_shuffle_ps(u01, u01, _MM_SHUFFLE(3, 2, 3, 2)));
        u23 = _mm256_add_ps(u23, _mm256_shuffle_ps(u23, u23, _MM_SHUFFLE(3, 2, 3, 2)));
        u01 = _mm256_add_ps(u01, _mm256_shuffle_ps(u01, u01, _MM_SHUFFLE(1, 1, 1, 1)));
        u23 = _mm256_add_ps(u23, _mm256_shuffle_ps(u23, u23, _MM_SHUFFLE(1, 1, 1, 1)));
        float t[16];
        _mm256_storeu_ps(t, u01);
        _mm256_storeu_ps(t + 8, u23);
        out[0] = t[0]; out[1] = t[4]; out[2] = t[8]; out[3] = t[12];
        return;
    }
#endif
    for (int j = 0; j < 4; j++) out[j] = nat_dot_head(a, b[j], K);
}

static void dot2(const float *a, int64_t lda, const float *b, int64_t K, float *out,
                 int64_t ldo)
{
    float acc[2][LANES] = {{0}};
    int64_t k = 0;
#ifdef NAT_SIMD
    __m256 c[2][4];
    for (int r = 0; r < 2; r++)
        for (int q = 0; q < 4; q++) c[r][q] = _mm256_setzero_ps();
    for (; k + LANES <= K; k += LANES)
        for (int q = 0; q < 4; q++) {
            __m256 bq = _mm256_loadu_ps(b + k + 8 * q);
            for (int r = 0; r < 2; r++)
                c[r][q] = _mm256_fmadd_ps(_mm256_loadu_ps(a + r * lda + k + 8 * q), bq,
                                          c[r][q]);
        }
    for (int r = 0; r < 2; r++)
        for (int q = 0; q < 4; q++) _mm256_storeu_ps(acc[r] + 8 * q, c[r][q]);
#else
    for (; k + LANES <= K; k += LANES)
        for (int r = 0; r < 2; r++)
            for (int j = 0; j < LANES; j++)
                acc[r][j] = fmaf(a[r * lda + k + j], b[k + j], acc[r][j]);
#endif
    for (int r = 0; r < 2; r++) out[r * ldo] = reduce(acc[r], a + r * lda, b, k, K);
}

/* y[r, o] = x[r, :] . W[o, :] for r < M, o < N. The weight row stays in L1 while every
   input row uses it, so a chunk of M rows reads the matrix from memory once. */
int nat_threads = 1;

void nat_set_threads(int64_t t) { nat_threads = t < 1 ? 1 : (int)t; }

#ifdef NAT_SIMD
/* nat_dot of 4 input rows with 3 weight rows, one accumulator chain at a time: each lane
   still sums its own k in increasing order, exactly as nat_dot, but 12 dots share every load
   (a prefill chunk is compute-bound, not memory-bound). */
static void tile43(const float *x, int64_t ldx, const float *W, int64_t K, float *y,
                   int64_t ldy)
{
    float lanes[4][3][LANES];
    int64_t kend = K - K % LANES;
    for (int q = 0; q < 4; q++) {
        __m256 acc[4][3];
        for (int r = 0; r < 4; r++)
            for (int o = 0; o < 3; o++) acc[r][o] = _mm256_setzero_ps();
        for (int64_t k = 8 * q; k < kend; k += LANES) {
            __m256 w0 = _mm256_loadu_ps(W + k), w1 = _mm256_loadu_ps(W + K + k),
                   w2 = _mm256_loadu_ps(W + 2 * K + k);
            for (int r = 0; r < 4; r++) {
                __m256 xr = _mm256_loadu_ps(x + r * ldx + k);
                acc[r][0] = _mm256_fmadd_ps(xr, w0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(xr, w1, acc[r][1]);
                acc[r][2] = _mm256_fmadd_ps(xr, w2, acc[r][2]);
            }
        }
        for (int r = 0; r < 4; r++)
            for (int o = 0; o < 3; o++) _mm256_storeu_ps(lanes[r][o] + 8 * q, acc[r][o]);
    }
    for (int r = 0; r < 4; r++)
        for (int o = 0; o < 3; o++)
            y[r * ldy + o] = reduce(lanes[r][o], x + r * ldx, W + o * K, kend, K);
}
#endif

/* y[r * ldy + o] = x[r * ldx :] . W[o, :] for r < M, o < N: every value by nat_dot's
   arithmetic (tile43 and dot2 are the same per pair), serial. */
void nat_gemm_block(const float *x, int64_t M, int64_t ldx, const float *W, int64_t N,
                    int64_t K, float *y, int64_t ldy)
{
    int64_t o0 = 0;
#ifdef NAT_SIMD
    if (M >= 4)
        for (; o0 + 3 <= N; o0 += 3) {
            int64_t r = 0;
            for (; r + 4 <= M; r += 4)
                tile43(x + r * ldx, ldx, W + o0 * K, K, y + r * ldy + o0, ldy);
            for (; r < M; r++)
                for (int o = 0; o < 3; o++)
                    y[r * ldy + o0 + o] = nat_dot(x + r * ldx, W + (o0 + o) * K, K);
        }
#endif
    for (int64_t o = o0; o < N; o++) {
        const float *w = W + o * K;
        int64_t r = 0;
        for (; r + 2 <= M; r += 2) dot2(x + r * ldx, ldx, w, K, y + r * ldy + o, ldy);
        for (; r < M; r++) y[r * ldy + o] = nat_dot(x + r * ldx, w, K);
    }
}

/* y[r, o] = x[r, :] . W[o, :] for r < M, o < N. The weight row stays in L1 while every
   input row uses it, so a chunk of M rows reads the matrix from memory once. Output rows
   are split across threads: a value's arithmetic does not depend on the split. */
void nat_gemm(const float *x, int64_t M, const float *W, int64_t N, int64_t K, float *y)
{
    int64_t B = 64;                                       /* weight rows per task */
#pragma omp parallel for schedule(static) num_threads(nat_threads) \
    if (nat_threads > 1 && N * K >= (1 << 16))
    for (int64_t o0 = 0; o0 < N; o0 += B)
        nat_gemm_block(x, M, K, W + o0 * K, (o0 + B < N ? B : N - o0), K, y + o0, N);
}

