"""The harness's sensitivity at a precision: the smallest perturbation it detects, per point
class (docs/precision.md, "Sensitivity").

    python tools/precision/precision_sensitivity.py [--precision bfloat16] [--layer 2] [--json FILE]

The port's output at one point class of one layer is scaled by 1 + eps at every position (its
attention output `attn_out`, its MLP output `mlp_out`, or the lanes `x` it hands on), inside
the port, so the change propagates as a real bug's would. For each class the smallest eps that
the check flags is found by bisection in log space (eps from 1e-7 to 1), at float32 (the float32
rules, no floor) and at the given precision (three-way, NOISE_RULES), beside each other: how much
coarser a low-precision port's check is. Tiny preset, seed 0, prompt 6 + 12 steps; about 3
minutes on the 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
CLASSES = ("attn_out", "mlp_out", "x")


def perturbed(port, point: str, layer: int, eps: float):
    """`port` with layer `layer`'s `point` scaled by 1 + eps (instance attributes shadow the
    methods the layer calls)."""
    s = 1.0 + eps
    if point == "attn_out":
        inner = port.attention

        def attention(i, *a, **k):
            out = inner(i, *a, **k)
            return out if i != layer else (*out[:5], port.rnd(out[5] * s))
        port.attention = attention
    elif point == "mlp_out":
        inner_mlp = port.mlp
        port.mlp = lambda i, h: port.rnd(inner_mlp(i, h) * (s if i == layer else 1.0))
    else:
        inner_layer = port.layer

        def layer_fn(i, *a, **k):
            X = inner_layer(i, *a, **k)
            return port.rnd(X * s) if i == layer else X
        port.layer = layer_fn
    return port


def detected(model, precision, point, layer, eps, steps) -> bool:
    from ladder.sides.judge import judge
    port = perturbed(model.our_port(precision=precision), point, layer, eps)
    return not judge(port, model, prompt_len=6, steps=steps, locate=False).passed


def smallest(model, precision, point, layer, steps, rounds: int = 9) -> float:
    lo, hi = 1e-7, 1.0                       # lo: not detected (checked), hi: detected
    if detected(model, precision, point, layer, lo, steps):
        return lo
    if not detected(model, precision, point, layer, hi, steps):
        return math.inf
    for _ in range(rounds):
        mid = math.sqrt(lo * hi)
        if detected(model, precision, point, layer, mid, steps):
            hi = mid
        else:
            lo = mid
    return hi


def main(argv=None) -> int:
    import torch
    torch.set_flush_denormal(True)
    from ladder.sides.judge import ModelUnderTest
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", default="bfloat16")
    ap.add_argument("--layer", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    model = ModelUnderTest.build(preset="tiny", seed=0)
    print(f"smallest detected scale 1+eps at L{args.layer:02d} (tiny, seed 0, prompt 6 + "
          f"{args.steps} steps, {torch.get_num_threads()} torch threads; bisection to a "
          f"factor {10 ** (7 / 2 ** 9):.2f})")
    print(f"{'point':10s} {'float32':>10s} {args.precision:>18s} {'ratio':>7s}")
    rows = []
    for point in CLASSES:
        e32 = smallest(model, None, point, args.layer, args.steps)
        elo = smallest(model, args.precision, point, args.layer, args.steps)
        rows.append({"point": point, "layer": args.layer, "float32": e32, "low": elo,
                     "precision": args.precision})
        print(f"{point:10s} {e32:10.2e} {elo:18.2e} {elo / e32:7.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
