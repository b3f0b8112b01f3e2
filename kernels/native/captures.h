/* The ladder points the native step captures, in the order of the caller's `cap` array.
   One table gives needle_step.c its enum and the names it exports (nat_capture_name), which
   kernels/native/__init__.py checks against its CAPTURES when it loads the library, and
   ladder/model/points.py checks against the point registry. */
#ifndef NEEDLE_CAPTURES_H
#define NEEDLE_CAPTURES_H

#define NAT_CAPTURES(F) \
    F(NX, "nx") F(HPRE, "hpre") F(U, "u") F(ALPHA, "alpha") F(BX, "bx") F(H, "h_in") \
    F(Q, "q") F(K, "k") F(V, "v") F(ATTN, "attn") F(GATE, "gate") F(AOUT, "attn_out") \
    F(APOST, "attn_post") F(MI, "mlp_in") F(MO, "mlp_out") F(BLOCK, "block_out") F(Y, "y") \
    F(HPOST, "hpost") F(RES, "res_logits") F(HRES, "hres") F(X, "x") F(MEAN, "lane_mean") \
    F(EMBED, "embed") F(EK, "engram_k") F(EV, "engram_v")

#define NAT_ENUM(e, s) C_##e,
#define NAT_NAME(e, s) s,
enum { NAT_CAPTURES(NAT_ENUM) C_COUNT };
static const char *const capture_names[] = {NAT_CAPTURES(NAT_NAME)};

#endif
