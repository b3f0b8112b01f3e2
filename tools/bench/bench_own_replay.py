"""What the own-op statistics cost a comparison (docs/precision.md, "Own-op statistics").

    python tools/bench/bench_own_replay.py [--precision bfloat16] [--steps 58] [--repeat 5]

Our port at the precision over prompt 6 + --steps (tiny preset, seed 0) is captured once, with
the reference and the noise floor; then, interleaved --repeat times, the comparison alone
(`compare_ladders`, folded as `compare` and `run` fold it) and the same with the own-op
replay and its sums (`own_sums`, then `own=`). Prints the medians, their ratio and the torch
thread count. About 10 s on the 2-core machine.
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
    from ladder.engine.compare import compare_ladders
    from ladder.engine.rules import NOISE_RULES, UNIT_EPS
    from ladder.model.precision import Precision
    from ladder.sides.judge import ModelUnderTest, capture
    from ladder.sides.own_error import own_sums
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", default="bfloat16")
    ap.add_argument("--steps", type=int, default=58)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    p = Precision.parse(args.precision)
    model = ModelUnderTest.build(preset="tiny", seed=0)
    cap = capture(model.our_port(precision=args.precision), model, prompt_len=6,
                  steps=args.steps)
    ref = model.reference(cap.tokens, 6, cap.window)
    floor = None if p.is_float32 else model.floor(cap.tokens, 6, cap.window, p)
    rules = None if p.is_float32 else NOISE_RULES

    def compare(own=None):
        kw = {} if rules is None else {"rules": rules}
        return compare_ladders(cap.obtained, ref, floor=floor, unit_eps=UNIT_EPS[p.activations],
                               precision=p, keep="summary", own=own, **kw)
    plain, replayed = [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        compare()
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        compare(own_sums(cap.obtained, model.ref_params, model.cfg, p, cap.window))
        replayed.append(time.perf_counter() - t)
    a, b = statistics.median(plain), statistics.median(replayed)
    print(f"{p.short()}, tiny, prompt 6 + {args.steps}, {torch.get_num_threads()} torch threads, "
          f"medians of {args.repeat}: compare {a:.3f} s, with the own-op replay {b:.3f} s "
          f"({b / a:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
