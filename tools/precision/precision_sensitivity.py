"""The harness's sensitivity at a precision: the smallest scale error it flags, per point class
(docs/precision.md, "Systematic errors", "Measured").

    python tools/precision/precision_sensitivity.py [--precision bfloat16] [--layer 2]
        [--steps 12] [--at 0.003] [--json FILE]

One point class of one layer (its attention output `attn_out`, its MLP output `mlp_out`, or the
lanes `x` it hands on) is scaled by 1 + eps at every position, two ways:
  compute  inside the port, so the change propagates as a real bug's would;
  records  only in what the port records, its other values untouched: an outside archive
           holding the float32 port's values rounded to the precision, one point's scaled
           before rounding (what `compare FILE reference` judges; the engine sees only records).
For each class and way the smallest eps that is *flagged* (a failure, or a certain finding
inside the margin, at the perturbed point) and the smallest that *fails* are found by bisection
in log space (eps from 1e-7 to 1), at float32 (compute only; float32 rules) and at the given
precision (three-way, NOISE_RULES, the systematic margins). --at EPS prints each case's verdict
at that one scale: where the first divergence is, or the finding; --pool N judges it again over
N models and pools them as a sweep does (ladder/sweep/pooled.py). Tiny preset, seed 0, prompt
6 + --steps; about 5 minutes on the 2-core machine, plus about 2 s a model for --pool.
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


class ScaledRecords:
    """The float32 port seen through the protocol alone, its records rounded to `dtype` as they
    leave it, one point's scaled by `s` first (an archive written by someone else's code)."""

    def __init__(self, inner, dtype, name, layer, s):
        self.inner, self.dtype, self.name, self.layer, self.s = inner, dtype, name, layer, s

    def make_state(self):
        return self.inner.make_state()

    def step_traced(self, token, state, logits, trace):
        def record(name, layer, v):
            if v.is_floating_point():
                if name == self.name and layer == self.layer:
                    v = v * self.s
                if self.dtype is not None:
                    v = v.to(self.dtype).float()
            trace(name, layer, v)
        return self.inner.step_traced(token, state, logits, record)


def judged(model, precision, way, point, layer, eps, steps):
    import torch
    from ladder.model.precision import Precision
    from ladder.sides.judge import judge
    if way == "compute":
        port = perturbed(model.our_port(precision=precision), point, layer, eps)
    else:
        p = None if precision is None else Precision.parse(precision)
        inner = model.our_port(precision=None if p is None or p.kv == "float32"
                               else f"float32,kv={p.kv}")
        port = ScaledRecords(inner, None if p is None else getattr(torch, p.activations),
                             point, layer, 1.0 + eps)
    return judge(port, model, prompt_len=6, steps=steps, locate=False,
                 precision=precision or "float32")


def verdict(model, precision, way, point, layer, eps, steps):
    """(status, where): status 'fail' (at `where`, the first divergence), 'finding' (at the
    perturbed point) or 'pass'."""
    from ladder.engine.systematic import ladder_point
    v = judged(model, precision, way, point, layer, eps, steps)
    if not v.passed:
        return "fail", v.cmp.first.key if v.cmp.first is not None else "logits"
    for r in v.cmp.systematic:          # chained or own-op, at the point or where it lands
        if r.finding and lands(ladder_point(r.point), way, point, layer):
            return "finding", r.point
    return "pass", ""


def lands(at: str, way: str, point: str, layer: int) -> bool:
    """Whether a statistic at `at` sees the scaled point: the point itself, or for the lanes
    scaled in compute (after `L{layer}.x` is recorded) the next layer's ops reading them."""
    if at == f"L{layer:02d}.{point}":
        return True
    return point == "x" and way == "compute" and at.startswith(f"L{layer + 1:02d}.")


def pooled(precision, way, point, layer, eps, steps, seeds: int) -> str:
    """The scale at `eps` over `seeds` models, pooled as a sweep pools them: the pool's status
    at the perturbed point, with its estimate."""
    from ladder.sides.judge import ModelUnderTest
    from ladder.sweep.pooled import pool, row_field
    rows = []
    for seed in range(seeds):
        model = ModelUnderTest.build(preset="tiny", seed=seed)
        v = judged(model, precision, way, point, layer, eps, steps)
        rows.append({"index": seed, "id": f"seed {seed}", "systematic": row_field(v.cmp),
                     "settings": {"precision": precision, "seed": seed}})
    (group,) = pool(rows)
    from ladder.engine.systematic import ladder_point
    for status, key in (("FAIL", "failing"), ("finding", "findings")):
        for r in group[key]:
            if lands(ladder_point(r.point), way, point, layer):
                return f"pooled {status}: {r.text()}"
    others = [r.point for r in group["failing"]]
    return f"pooled pass{' (failing elsewhere: ' + ', '.join(others) + ')' if others else ''}"


def smallest(test, rounds: int = 8) -> float:
    """The smallest eps in 1e-7..1 for which test(eps) holds (bisection in log space)."""
    lo, hi = 1e-7, 1.0                       # lo: not detected (checked), hi: detected
    if test(lo):
        return lo
    if not test(hi):
        return math.inf
    for _ in range(rounds):
        mid = math.sqrt(lo * hi)
        if test(mid):
            hi = mid
        else:
            lo = mid
    return hi


def main(argv=None) -> int:
    import torch
    torch.set_flush_denormal(True)
    from ladder.engine.systematic import ladder_point
    from ladder.sides.judge import ModelUnderTest
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", default="bfloat16")
    ap.add_argument("--layer", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--json", default=None)
    ap.add_argument("--at", type=float, default=0.003)
    ap.add_argument("--pool", type=int, default=0, metavar="SEEDS",
                    help="also judge --at over this many models (seeds 0..SEEDS-1) and pool "
                         "them as a sweep does")
    args = ap.parse_args(argv)
    model = ModelUnderTest.build(preset="tiny", seed=0)
    print(f"smallest scale 1+eps flagged / failing at L{args.layer:02d} (tiny, seed 0, prompt "
          f"6 + {args.steps} steps, {torch.get_num_threads()} torch threads; bisection to a "
          f"factor {10 ** (7 / 2 ** 8):.2f})")
    print(f"{'point':10s} {'way':8s} {'float32 fails':>13s} {args.precision + ' flagged':>17s} "
          f"{'fails':>9s}   at 1+{args.at:g}")
    rows = []
    for point in CLASSES:
        def status(prec, way, eps, point=point):
            return verdict(model, prec, way, point, args.layer, eps, args.steps)
        e32 = smallest(lambda e: status(None, "compute", e)[0] == "fail")
        for way in ("compute", "records"):
            flag = smallest(lambda e, w=way: status(args.precision, w, e)[0] != "pass")
            fail = smallest(lambda e, w=way: status(args.precision, w, e)[0] == "fail")
            st, where = status(args.precision, way, args.at)
            at = f"{st} at {where}" if where else st
            located = lands(ladder_point(where.rpartition("/")[2]), way, point, args.layer)
            rows.append({"point": point, "layer": args.layer, "way": way, "float32": e32,
                         "flagged": flag, "fails": fail, "precision": args.precision,
                         "at": args.at, "at_status": st, "at_where": where,
                         "at_located": located})
            print(f"{point:10s} {way:8s} {e32:13.2e} {flag:17.2e} {fail:9.2e}   {at}"
                  f"{'' if located or st == 'pass' else '  (not the perturbed point)'}")
            if args.pool:
                rows[-1]["pooled"] = pooled(args.precision, way, point, args.layer, args.at,
                                            args.steps, args.pool)
                print(f"{'':19s} {args.pool} models at 1+{args.at:g}: {rows[-1]['pooled']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
