/* Shared declarations of the native CPU step (needle_step.c) and its packed Cactus-Quants
   products (cq_packed.c). The ctypes mirrors live in kernels/native/__init__.py. */
#ifndef NEEDLE_NATIVE_H
#define NEEDLE_NATIVE_H
#include <stdint.h>

/* One Cactus-Quants matrix as stored: LSB-first `bits`-wide codes [rows, row_bytes], a
   float32 norm per 128-wide group [rows, in_pad/128], and the level of every code value
   (levels[16], unused entries 0). Rows may be a band of a larger matrix. */
typedef struct {
    const uint8_t *packed;
    const float *norms, *levels;
    int64_t rows, in_features, in_pad, row_bytes, bits;
} CqMat;

typedef struct {
    int64_t L, n, d, H, KV, hd, hada, max_seq, vocab, sinkhorn_iters;
    float eps, attn_scale, walsh_scale;
    const float *emb;                     /* [vocab, d] tied embedding / LM head */
    const float *qkvg, *out, *router;     /* [L, 2attn+2kvd, d], [L, d, attn], [L, 2n+n^2, n*d] */
    const float *qn, *kn;                 /* [L, hd] */
    const float *pre, *post, *pre_hada;   /* [L, d] */
    const float *attn_gate;               /* [L], already through the sigmoid */
    const float *d1, *d2, *d3;            /* [L, hada] */
    const float *pre_bias, *post_bias;    /* [L, n], lane offsets folded in */
    const float *a_pre, *a_post, *a_res;  /* [L] */
    const float *b_res;                   /* [L, n, n] */
    const float *cos_t, *sin_t;           /* [max_seq, hd/2] */
    const float *final_scale;             /* [d] */
    const int64_t *site_of_layer;         /* [L], -1: no Engram site */
    /* Engram: `sites` sites of T = orders*heads tables with `sub` columns each; the value
       ring holds `ering` un-convolved rows; `taps` taps `dil` positions apart. */
    int64_t sites, T, sub, taps, dil, ering;
    const float **tables;                 /* per site [T*slots, sub] */
    const float **eng_kv;                 /* per site [2d, T*sub]: key rows, then value rows */
    const float **eng_taps;               /* per site [taps, d] */
    /* cq = 1: every matrix above is NULL and these hold the packed codes instead */
    int64_t cq, cq_max_in;                 /* widest padded input */
    const CqMat *cq_qkvg;                  /* [L, 4]: q, k, v, gate */
    const CqMat *cq_out, *cq_router;       /* [L], [L, 3]: the pre, post, res rows of layer i */
    const CqMat *cq_emb;                   /* the tied embedding / LM head */
    const CqMat *cq_eng_kv, *cq_tables;    /* [sites, 2]: key, value; [sites] */
} NModel;

typedef struct {
    float *k, *v;                          /* [L, KV, R, hd] */
    uint8_t *key_ok;                       /* [R] */
    float *lanes, *hidden;                 /* [n, d], [d] */
    float *vraw;                           /* [sites, ering, d] Engram value ring */
    int64_t R, window;                     /* window 0: every position so far */
} NState;

extern int nat_threads;          /* set by nat_set_threads */
float nat_dot(const float *a, const float *b, int64_t K);
float nat_tree32(const float *acc);   /* the fixed tree over nat_dot's 32 lanes */
float nat_dot_head(const float *a, const float *b, int64_t K);   /* attention scores */
void nat_dot_head4(const float *a, const float *const b[4], int64_t K, float *out);
void nat_gemm(const float *x, int64_t M, const float *W, int64_t N, int64_t K, float *y);
void nat_gemm_block(const float *x, int64_t M, int64_t ldx, const float *W, int64_t N,
                    int64_t K, float *y, int64_t ldy);
void nat_fwht(float *x, int64_t n, float scale);

/* y[r, col..] = the concatenated rows of mats[0..nmats-1] times x[r, :K] for r < M (one
   input width); scratch xp holds M rotated inputs of in_pad floats. */
void nat_cq_product(const CqMat *mats, int64_t nmats, const float *x, int64_t M, int64_t K,
                    float *y, int64_t ldy, float *xp);
void nat_cq_rotate(const float *x, int64_t K, int64_t in_pad, float *xp);
/* Row r of the dequantised matrix, its first in_features values (tmp: in_pad floats). */
void nat_cq_row(const CqMat *A, int64_t r, float *out, float *tmp);

/* cq_wide.c (AVX-512 builds only): the one-token 2-bit and 4-bit rows, 16 lanes a vector */
void nat_cq_wide_rows2(const CqMat *A, int64_t o, const float *xp, float *y);
void nat_cq_wide_perm(const float *xp, int64_t in_pad, float *xq);
void nat_cq_wide_rows4(const CqMat *A, int64_t o, int64_t nr, const float *xq, float *y);

#endif
