"""How often one Sinkhorn iteration fewer (`sinkhorn_19`) is found in a bfloat16 port, run by
run and pooled as a sweep pools (docs/precision.md, "Iteration count").

    python tools/precision/iteration_detect.py [--seeds 8] [--steps 12,58] [--precision bfloat16]
        [--jobs 2] [--honest]

Each case: our port at the precision with the fault planted, tiny preset, prompt 6 + steps,
judged three-way (`judge`, locate off). Reported per schedule: the cases that fail, the cases
whose first divergence is `L00.hres` (where float32 locates the fault), and the sweep's pool
over the schedule's cases (ladder/sweep/pooled.py), with its failing points. --honest runs the
same cases with no fault (every count must be 0). About 2 minutes at the defaults on the
2-core machine (-j 2).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
FAULT = "sinkhorn_19"


def run_case(case: dict) -> dict:
    import contextlib

    import torch
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    from ladder.sides.faults import planted
    from ladder.sides.judge import ModelUnderTest, judge
    from ladder.sweep.pooled import row_field
    model = ModelUnderTest.build(preset="tiny", seed=case["seed"])
    with planted(FAULT) if case["fault"] else contextlib.nullcontext():
        v = judge(model.our_port(precision=case["precision"]), model, prompt_len=6,
                  steps=case["steps"], locate=False)
    first = v.cmp.first
    return dict(case, passed=v.passed, first=None if first is None else first.point,
                failing=[r.text() for r in v.cmp.systematic if r.failed],
                systematic=row_field(v.cmp))


def main(argv=None) -> int:
    from ladder.sweep.pooled import pool
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--steps", default="12,58")
    ap.add_argument("--precision", default="bfloat16")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--honest", action="store_true", help="no fault planted")
    args = ap.parse_args(argv)
    steps = [int(s) for s in args.steps.split(",")]
    todo = [dict(seed=s, steps=n, precision=args.precision, fault=not args.honest)
            for n in steps for s in range(args.first_seed, args.first_seed + args.seeds)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as ex:
        rows = list(ex.map(run_case, todo))
    what = "no fault" if args.honest else FAULT
    print(f"{what} at {args.precision}: {len(rows)} cases (tiny, prompt 6 + {args.steps}, "
          f"seeds {args.first_seed}..{args.first_seed + args.seeds - 1}), -j {args.jobs}, "
          f"{time.perf_counter() - t0:.0f} s")
    for i, r in enumerate(rows):
        # a pool per schedule: the schedule as a setting the pool does not span
        r.update(index=i, id=f"{r['seed']}/6+{r['steps']}",
                 settings={"schedule": f"6+{r['steps']}", "precision": r["precision"],
                           "seed": r["seed"]})
    pools = {g["settings"]["schedule"]: g for g in pool(rows)}
    for n in steps:
        g = [r for r in rows if r["steps"] == n]
        fail = [r for r in g if not r["passed"]]
        at = [r for r in fail if r["first"] == "L00.hres"]
        print(f"6 + {n}: {len(fail)} of {len(g)} cases fail, {len(at)} first at L00.hres")
        for r in fail:
            print(f"    seed {r['seed']}: first {r['first']}; {r['failing'][0][:110]}"
                  if r["failing"] else f"    seed {r['seed']}: first {r['first']}")
        pg = pools.get(f"6+{n}")
        if pg:
            print(f"    pooled over {len(pg['cases'])} cases: {len(pg['failing'])} points fail")
            for x in pg["failing"][:6]:
                print(f"        {x.text()[:150]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
