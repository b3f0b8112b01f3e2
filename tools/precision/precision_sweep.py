"""Our port at low precision over a seed x schedule x precision sweep: false alarms of the
noise-unit rules, and how far the float32 rules miss (docs/precision.md, "Measured").

    python tools/precision/precision_sweep.py [--seeds 8] [--jobs 2] [--shipped] [--json FILE]

Each case builds the port at its precision (`V2Model.from_params(precision=...)`, torch backend,
eager), judges it three-way (`judge`, the noise-floor reference at the same precision, the
default NOISE_RULES) and again under the float32 rules (DEFAULT_RULES, no floor). An honest
port must pass the first everywhere; the second says by how much a float32 bound misjudges it.
Tiny: every precision x seed x three schedules (prompt 6 + 12 steps, 10 + 30, prompt 20 + 20:
each past the window of 8). --shipped adds the shipped geometry: prompt 6 + 6 steps per
precision, and prompt 264 + 4 steps (past the window of 256) at bfloat16 and float32,kv=int8.
Expected runtime on the 2-core machine at -j 2: about 11 minutes with --seeds 8 --shipped
(measured 667 s, the machine shared), about 7 of them the 96 tiny cases.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRECISIONS = ("bfloat16", "float16", "float32,kv=int8", "bfloat16,kv=int8")
TINY_SCHEDULES = ((6, 12), (10, 30), (20, 20))


def run_case(case: dict) -> dict:
    sys.path.insert(0, REPO)
    import torch
    torch.set_flush_denormal(True)
    torch.set_num_threads(1)
    from ladder.engine.compare import compare_ladders
    from ladder.engine.rules import DEFAULT_RULES
    from ladder.sides.judge import ModelUnderTest, judge
    t0 = time.perf_counter()
    model = ModelUnderTest.build(preset=case["preset"], seed=case["seed"])
    port = model.our_port(precision=case["precision"])
    v = judge(port, model, prompt_len=case["prompt"], steps=case["steps"], locate=False)
    f32 = compare_ladders(v.obtained, v.yardstick, DEFAULT_RULES)
    w32 = f32.worst()
    ratio = max((r.noise_ratio for r in v.cmp.rows if not math.isnan(r.noise_ratio)),
                default=0.0)
    return dict(case, passed=v.passed, failing=len(v.cmp.failures),
                first=None if v.cmp.first is None else v.cmp.first.key,
                worst=v.worst_fraction, worst_point=v.worst.key, max_noise_ratio=ratio,
                f32_failing=len(f32.failures), f32_points=len(f32.rows),
                f32_worst=w32.error, f32_worst_point=w32.key,
                seconds=time.perf_counter() - t0)


def cases(seeds: int, shipped: bool) -> list:
    out = [dict(preset="tiny", seed=s, precision=p, prompt=pl, steps=st)
           for p in PRECISIONS for s in range(seeds) for pl, st in TINY_SCHEDULES]
    if shipped:
        out += [dict(preset="shipped", seed=0, precision=p, prompt=6, steps=6)
                for p in PRECISIONS]
        out += [dict(preset="shipped", seed=1, precision=p, prompt=264, steps=4)
                for p in ("bfloat16", "float32,kv=int8")]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--shipped", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    todo = cases(args.seeds, args.shipped)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run_case, todo))
    print(f"{len(rows)} cases, -j {args.jobs}, 1 torch thread each, "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"{'precision':18s} {'cases':>5s} {'false alarms':>12s} {'worst of allow':>14s} "
          f"{'max x floor':>11s} {'f32 rules: failing cases':>24s} {'f32 worst err':>13s}")
    for p in PRECISIONS:
        g = [r for r in rows if r["precision"] == p]
        print(f"{p:18s} {len(g):5d} {sum(not r['passed'] for r in g):12d} "
              f"{max(r['worst'] for r in g):14.3g} {max(r['max_noise_ratio'] for r in g):11.3g} "
              f"{sum(r['f32_failing'] > 0 for r in g):>17d} of {len(g):<4d} "
              f"{min(r['f32_worst'] for r in g):.3g}..{max(r['f32_worst'] for r in g):.3g}")
    for r in rows:
        if not r["passed"]:
            print(f"FALSE ALARM: {r['preset']} seed {r['seed']} {r['precision']} prompt "
                  f"{r['prompt']} + {r['steps']}: {r['first']} ({r['worst']:.3g} of allowance)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
