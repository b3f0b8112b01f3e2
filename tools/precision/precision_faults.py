"""Every plantable fault (`python -m ladder run --list-faults`) judged at float32 and again at
bfloat16 (docs/precision.md, "Faults at bfloat16").

    python tools/precision/precision_faults.py [--precision bfloat16] [--steps 12] [--json FILE]

Per fault: where the float32 suite locates it (first divergence, own/inherited), then where the
port at the given precision, judged three-way under NOISE_RULES, locates it: at the same point,
elsewhere (and why: the first point whose ratio leaves its rule), or nowhere, below the noise
floor. A fault below the floor is reported with its size in noise units: the float32 faulty
port against the float32 reference, counted in units of that precision's noise floor (its
largest ratio over the ladder, and at the point float32 locates). Never reported as a pass.
Tiny preset, seed 0, prompt 6 + --steps; about 1 minute on the 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


def judge_fault(name, models, precision, steps):
    from ladder.sides.faults import FAULTS, planted
    from ladder.sides.judge import judge
    fault = FAULTS[name]
    model = models[fault.weights or "dense"]
    with planted(name):
        v32 = judge(model.our_port(), model, prompt_len=6, steps=steps)
        vlo = judge(model.our_port(precision=precision), model, prompt_len=6, steps=steps)
    return model, v32, vlo


def size_in_noise_units(model, v32, precision):
    """(largest ratio over the ladder, ratio at the float32 first divergence)."""
    from ladder.engine.compare import compare_ladders
    from ladder.engine.rules import NOISE_RULES, UNIT_EPS
    from ladder.model.precision import Precision
    p = Precision.parse(precision)
    floor = model.floor(v32.tokens, v32.prompt_len, v32.window, p)
    cmp = compare_ladders(v32.obtained, v32.yardstick, NOISE_RULES, floor=floor,
                          unit_eps=UNIT_EPS[p.activations])
    ratios = [r.noise_ratio for r in cmp.rows if not math.isnan(r.noise_ratio)]
    at = v32.cmp.first
    here = cmp.row(at.step, at.point).noise_ratio if at is not None else math.nan
    return max(ratios, default=0.0), here


def main(argv=None) -> int:
    import torch
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    from ladder.sides.faults import FAULTS
    from ladder.sides.judge import ModelUnderTest
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", default="bfloat16")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    models = {"dense": ModelUnderTest.build(preset="tiny", seed=0),
              "cq": ModelUnderTest.build(preset="tiny", seed=0, weights="cq")}
    print(f"faults at float32 and at {args.precision}: tiny, seed 0, prompt 6 + {args.steps} "
          f"steps, {torch.get_num_threads()} torch threads")
    rows = []
    for name in FAULTS:
        model, v32, vlo = judge_fault(name, models, args.precision, args.steps)
        f32 = v32.cmp.first
        row = {"fault": name, "f32": None if f32 is None else f32.key,
               "f32_verdict": None if v32.location is None else v32.location.verdict[:60]}
        if f32 is None:
            row["at_precision"] = "not located at float32 either"
        else:
            lo = vlo.cmp.first
            worst, here = size_in_noise_units(model, v32, args.precision)
            row.update(size_max=worst, size_at_f32_point=here,
                       low=None if lo is None else lo.key,
                       low_verdict=None if vlo.location is None else vlo.location.verdict[:60])
            if lo is None:
                row["at_precision"] = (f"below the {args.precision} noise floor: {worst:.3g} "
                                       f"noise units at most ({here:.3g} at {f32.key})")
            elif lo.key == f32.key:
                row["at_precision"] = "located at the same point"
            else:
                row["at_precision"] = (f"located elsewhere: {lo.key} ({f32.key} is "
                                       f"{here:.3g} noise units, under the rule's "
                                       f"{lo.rule.noise:g}; the fault shows first at "
                                       f"{lo.key})")
        rows.append(row)
        print(f"{name:22s} float32: {row['f32']}; {args.precision}: {row['at_precision']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
