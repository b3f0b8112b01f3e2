/* Where a step's time goes, per stage (tools/bench/bench_native_stages.py). Built only with
   -DNEEDLE_STAGE_CLOCK (its own cached library, kernels.native.stage_build): a normal build
   compiles every STAGE() to nothing, so the clock costs the shipped step no instruction.
   Each STAGE(id) charges the time since the previous mark to stage `id`; STAGE_START sets the
   mark. One thread (the step is called from one thread; the products' workers never mark). */
#ifndef NEEDLE_STAGES_H
#define NEEDLE_STAGES_H
#include <stdint.h>

#define NAT_STAGES(F) \
    F(ST_EMBED, "embed") F(ST_ENGRAM, "engram") F(ST_ROUTER, "router") \
    F(ST_LANES, "lanes_sinkhorn") F(ST_QKVG, "qkvg") F(ST_ATTN, "attention") \
    F(ST_OUT, "out_proj") F(ST_MLP, "mlp_mix") F(ST_HEAD, "final_lm_head")

#define NAT_SENUM(e, s) e,
enum { NAT_STAGES(NAT_SENUM) ST_COUNT };

#ifdef NEEDLE_STAGE_CLOCK
#include <time.h>
extern double nat_stage_ns[ST_COUNT];
extern double nat_stage_mark;
static inline double nat_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}
#define STAGE_START() (nat_stage_mark = nat_now_ns())
#define STAGE(id) do { double now_ = nat_now_ns(); nat_stage_ns[id] += now_ - nat_stage_mark; \
                       nat_stage_mark = now_; } while (0)
#else
#define STAGE_START() ((void)0)
#define STAGE(id) ((void)0)
#endif

#endif
