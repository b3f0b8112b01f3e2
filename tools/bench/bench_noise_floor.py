"""What the noise floor costs: the reference at a declared precision beside the float32
reference, same schedule, side by side in one run (docs/performance.md, "Judging at a precision").

    python tools/bench/bench_noise_floor.py [--preset shipped] [--steps 10] [--repeat 3] [--threads 1]

Medians of --repeat captures each (interleaved, so load drifts hit both alike), thread count
recorded. About 1 minute at the shipped defaults on the 2-core machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


def main(argv=None) -> int:
    import torch
    torch.set_flush_denormal(True)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="shipped")
    ap.add_argument("--prompt-len", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from ladder.model.precision import Precision
    from ladder.sides.capture import capture_reference
    from ladder.sides.judge import ModelUnderTest
    from ladder.sides.noise_floor import capture_floor
    model = ModelUnderTest.build(preset=args.preset, seed=0)
    toks = model.tokens(args.prompt_len + args.steps)
    runs = {"reference (float32)": lambda: capture_reference(model.ref_params, model.cfg, toks,
                                                             args.prompt_len)}
    for spec in ("bfloat16", "float16", "float32,kv=int8", "bfloat16,kv=int8"):
        p = Precision.parse(spec)
        runs[f"noise floor {spec}"] = (lambda p=p: capture_floor(model.ref_params, model.cfg,
                                                                 toks, args.prompt_len, p))
    times = {k: [] for k in runs}
    for _ in range(args.repeat):
        for k, fn in runs.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    base = statistics.median(times["reference (float32)"])
    print(f"{args.preset}: prompt {args.prompt_len} + {args.steps} steps, {args.threads} torch "
          f"thread(s), medians of {args.repeat}")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"  {k:28s} {m:7.2f} s  {m / base:5.2f}x the float32 reference")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
