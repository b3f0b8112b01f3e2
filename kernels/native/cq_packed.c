/* Cactus-Quants products straight from the packed codes (the native twin of CqWeight's
   "packed" form):

       y[o] = sum_g norm[o, g] * sum_{bytes b of group g} lut[b][packed[o, b]]

   where lut[b][v] is the dot of the levels byte value v encodes with the rotated input's
   entries byte b covers. One table per input and code width serves every matrix reading
   that input (q|k|v|gate, the three mHC routers), so a weight costs one byte load and one add
   per byte instead of four bytes of float32 streamed from memory: the 2-bit codes of the
   whole shipped model (12.9 MB) stay in the last-level cache.

   Every input row is handled alone (rotation, table, products), so a row's bits do not
   depend on the rows sharing the call: prefill == steps, bit for bit. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "native.h"

#define GROUP 128

static const float H128 = 0.08838834764831845f;     /* 1/sqrt(128), rounded once to f32 */

static void rotate(const float *x, int64_t K, int64_t in_pad, float *xp)
{
    memcpy(xp, x, (size_t)K * sizeof(float));
    memset(xp + K, 0, (size_t)(in_pad - K) * sizeof(float));
    for (int64_t g = 0; g < in_pad; g += GROUP) nat_fwht(xp + g, GROUP, H128);
}

/* The input's lookup table for one code width.
   2-bit (4 codes a byte): lut[b * 256 + v] = dot of byte value v's levels with xp[4b..4b+3],
     made as (codes 0,1 of v) + (codes 2,3 of v) from two 16-entry pair tables: 128 KB for a
     512-wide input, in L2.
   4-bit (2 codes a byte): lut[j * 16 + c] = level[c] * xp[j], one entry per code and
     position (32 KB for 512 wide, in L1); a byte reads two entries. A byte-wide table would
     be 8x larger and miss L2. */
static void build_lut(const float *xp, int64_t in_pad, const float *blev, int64_t per,
                      float *lut)
{
    if (per == 2) {
        for (int64_t j = 0; j < in_pad; j++)
            for (int c = 0; c < 16; c++) lut[j * 16 + c] = blev[c] * xp[j];
        return;
    }
    for (int64_t b = 0; b < in_pad / 4; b++) {
        const float *x = xp + 4 * b;
        float lo[16], hi[16], *row = lut + b * 256;
        for (int u = 0; u < 16; u++) {
            lo[u] = blev[u & 3] * x[0] + blev[u >> 2] * x[1];
            hi[u] = blev[u & 3] * x[2] + blev[u >> 2] * x[3];
        }
        for (int v = 0; v < 256; v++) row[v] = lo[v & 15] + hi[v >> 4];
    }
}

static float cq_dot(const CqMat *A, int64_t o, const float *lut)
{
    const uint8_t *codes = A->packed + o * A->row_bytes;
    const float *norm = A->norms + o * (A->in_pad / GROUP);
    int64_t per_group = GROUP / A->per;                  /* bytes per 128-group */
    float acc = 0.0f;
    for (int64_t g = 0; g < A->in_pad / GROUP; g++) {
        const uint8_t *c = codes + g * per_group;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        if (A->per == 2) {
            const float *t = lut + g * GROUP * 16;
            for (int64_t b = 0; b < per_group; b += 2) {
                s0 += t[(2 * b + 0) * 16 + (c[b] & 15)];
                s1 += t[(2 * b + 1) * 16 + (c[b] >> 4)];
                s2 += t[(2 * b + 2) * 16 + (c[b + 1] & 15)];
                s3 += t[(2 * b + 3) * 16 + (c[b + 1] >> 4)];
            }
        } else {
            const float *t = lut + g * per_group * 256;
            for (int64_t b = 0; b < per_group; b += 4) {
                s0 += t[(b + 0) * 256 + c[b + 0]];
                s1 += t[(b + 1) * 256 + c[b + 1]];
                s2 += t[(b + 2) * 256 + c[b + 2]];
                s3 += t[(b + 3) * 256 + c[b + 3]];
            }
        }
        acc += norm[g] * ((s0 + s1) + (s2 + s3));
    }
    return acc;
}

void nat_cq_product(const CqMat *mats, int64_t nmats, const float *x, int64_t M, int64_t K,
                    float *y, int64_t ldy, float *xp, float *lut)
{
    for (int64_t r = 0; r < M; r++) {
        rotate(x + r * K, K, mats[0].in_pad, xp);
        const float *built = 0;
        int64_t col = 0;
        for (int64_t i = 0; i < nmats; i++) {
            const CqMat *A = mats + i;
            if (A->blev != built) {                      /* same width: same table */
                build_lut(xp, A->in_pad, A->blev, A->per, lut);
                built = A->blev;
            }
            float *yr = y + r * ldy + col;
            for (int64_t o = 0; o < A->rows; o++) yr[o] = cq_dot(A, o, lut);
            col += A->rows;
        }
    }
}

void nat_cq_row(const CqMat *A, int64_t r, float *out, float *tmp)
{
    const uint8_t *codes = A->packed + r * A->row_bytes;
    const float *norm = A->norms + r * (A->in_pad / GROUP);
    for (int64_t j = 0; j < A->in_pad; j++) {
        int64_t b = j / A->per, c = j % A->per;
        tmp[j] = A->blev[c * 256 + codes[b]] * norm[j / GROUP];
    }
    for (int64_t g = 0; g < A->in_pad; g += GROUP) nat_fwht(tmp + g, GROUP, H128);
    memcpy(out, tmp, (size_t)A->in_features * sizeof(float));
}
