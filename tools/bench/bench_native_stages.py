"""Where a native step's time goes: per-stage medians over one-token steps (issue 48).

    NEEDLE_NATIVE_MARCH=x86-64-v3 python tools/bench/bench_native_stages.py [--weights cq]
        [--preset shipped] [--at 300] [--steps 200] [--json OUT]

Builds the step with the per-stage clock (kernels/native/stages.h: -DNEEDLE_STAGE_CLOCK, its own
cached library; the normal build has no clock), prefills to position `--at` and times
`--steps` steps on 1 thread. Prints each stage's median ms per step (summed over the 27
layers), the C call's total, and the floor: the weight bytes a step reads streamed once
(tools/bench/weight_floor.py) in the same run, with the step's ratio to it. The -march comes
from $NEEDLE_NATIVE_MARCH (default native), so an AVX2-only target is measurable anywhere.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from weight_floor import floor_ms, table_mb                      # noqa: E402
from bench_decode import held_mb                                 # noqa: E402
from kernels import native                                       # noqa: E402
from port.batch import V2Batch                                   # noqa: E402
from port.model import V2Model                                   # noqa: E402
from reference import cact                                       # noqa: E402
from reference.config import V2Config                            # noqa: E402
from reference.params import init_params                         # noqa: E402


def isa() -> str:
    """The vector extensions this CPU reports (the target may use fewer: -march)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    except OSError:
        flags = []
    want = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vbmi")
    return " ".join(f for f in want if f in flags) or "unknown"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="shipped", choices=["tiny", "shipped"])
    ap.add_argument("--weights", default="cq", choices=["cq", "dense"])
    ap.add_argument("--at", type=int, default=300)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    cfg = V2Config.preset(args.preset)
    at = min(args.at, cfg.max_seq_len - args.steps - 1)
    params = init_params(cfg, 0, perturbed=True)
    with tempfile.TemporaryDirectory() as tmp, native.stage_build():
        native.set_threads(1)
        if args.weights == "cq":
            path = os.path.join(tmp, "bench.cact")
            with open(path, "wb") as f:
                f.write(cact.build_cact(params, cfg).to_bytes())
            model = V2Model.from_cact(path, "cq", backend="native")
        else:
            model = V2Model.from_params(params, cfg, backend="native")
        g = torch.Generator().manual_seed(0)
        tok = iter(torch.randint(1, cfg.vocab_size, (at + args.steps + 8,),
                                 generator=g).tolist())
        state = model.make_state()
        model.prefill_batch([next(tok) for _ in range(at)], state, V2Batch(model, 64))
        for _ in range(3):
            model.step(next(tok), state)                       # warm
        native.stage_take()
        per, total = [], []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            model.step(next(tok), state)
            total.append((time.perf_counter() - t0) * 1e3)
            per.append(native.stage_take())
        read_mb = held_mb(model) - table_mb(model)
        floor = floor_ms(read_mb)
        # The KV window a step also reads (float32 K and V of every layer's window): not
        # weights, so not in the floor, but a bound of its own on the attention stage.
        keys = min(state.pos, state.window) if state.window else state.pos
        kv_mb = 2 * cfg.num_layers * cfg.num_kv_heads * keys * cfg.head_dim * 4 / 2**20
        with_kv = floor_ms(read_mb + kv_mb)["floor_ms"]
    med = {k: statistics.median(p[k] for p in per) for k in per[0]}
    c_ms = statistics.median(sum(p.values()) for p in per)
    step_ms = statistics.median(total)
    res = {"preset": args.preset, "weights": args.weights, "at": at, "steps": args.steps,
           "march": native.MARCH, "cpu_isa": isa(), "stages_ms": med, "c_step_ms": c_ms,
           "step_ms": step_ms, "weights_read_mb": read_mb, **floor,
           "step_vs_floor": step_ms / floor["floor_ms"], "kv_read_mb": kv_mb,
           "floor_with_kv_ms": with_kv}
    print(f"native:{args.weights} -march={native.MARCH} (cpu: {isa()}), position {at}, "
          f"medians of {args.steps} steps, 1 thread")
    for k, v in med.items():
        print(f"  {k:16s} {v:8.3f} ms  {100 * v / c_ms:5.1f} %")
    print(f"  {'C step':16s} {c_ms:8.3f} ms;  whole step (Python included) {step_ms:.3f} ms")
    print(f"floor: {read_mb:.2f} MiB of weights read once: sum {floor['sum_ms']:.3f} ms, "
          f"matvec {floor['matvec_ms']:.3f} ms; step / floor = {res['step_vs_floor']:.2f}x")
    print(f"with the KV window it also reads ({kv_mb:.2f} MiB): {with_kv:.3f} ms "
          f"(step / that = {step_ms / with_kv:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    main()
