"""False alarms of the systematic statistics over honest ports (docs/precision.md, "Systematic
errors", "Measured"): every case judged three-way at its precision, then each group's cases
pooled as a sweep pools them (ladder/sweep/pooled.py).

    python tools/precision/systematic_false_alarms.py [--seeds 6] [--f32-seeds 34]
        [--triton-seeds 4] [--first-seed 0] [--jobs 2] [--json FILE]

Honest ports, three rounding orders against the floor's (the reference rounding at every op):
  ours      port.V2Model at the precision: float32 arithmetic, one rounding per store
  recorded  the float32 port (its KV format kept), values rounded only where they are recorded:
            the computation never sees a rounded value
  blocked   ours with every weight product summed in blocks of BLOCK inputs, the running sum
            rounded to the activation dtype after each block (a 16-bit accumulator)
Each at bfloat16, float16, float32,kv=int8 and bfloat16,kv=int8 (recorded at float32,kv=int8
is ours: nothing else rounds), x seeds x the schedules prompt 6 + 12, 10 + 30, 20 + 20 (tiny
preset); and our float32 port against the float32 rules over --f32-seeds x the same schedules.
A case is a false alarm if it fails at all; a pool if a point fails pooled. Findings (certain,
inside the margin) are counted, not alarms. About 6 minutes at -j 2 on the 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
PRECISIONS = ("bfloat16", "float16", "float32,kv=int8", "bfloat16,kv=int8")
PORTS = ("ours", "recorded", "blocked", "triton")
TRITON_PRECISIONS = ("bfloat16", "float16")
SCHEDULES = ((6, 12), (10, 30), (20, 20))
BLOCK = 32


class RecordedOnly:
    """A port seen through the protocol alone (make_state, step_traced: no batched prefill
    to hold to the step), its records rounded to `dtype` as they leave it (None: as they are)."""

    def __init__(self, inner, dtype):
        self.inner, self.dtype = inner, dtype

    def make_state(self):
        return self.inner.make_state()

    def step_traced(self, token, state, logits, trace):
        import torch

        def rounded(name, layer, v):
            keep = self.dtype is None or not v.is_floating_point()
            trace(name, layer, v if keep else v.to(self.dtype).to(torch.float32))
        return self.inner.step_traced(token, state, logits, rounded)


def blocked(port):
    """`port` with its weight products accumulated BLOCK inputs at a time in its store dtype."""
    import torch

    def mm(x, wt):
        acc = torch.zeros(x.shape[0], wt.shape[1])
        for k in range(0, wt.shape[0], BLOCK):
            acc = port.rnd(acc + x[:, k:k + BLOCK] @ wt[k:k + BLOCK])
        return acc
    port.mm = mm
    return RecordedOnly(port, None)      # its prefill_batch keeps the plain products


def _port(model, kind, precision):
    import torch
    from ladder.model.precision import Precision
    if kind == "ours":
        return model.our_port(precision=precision)
    if kind == "triton":
        return model.our_port(backend="triton", precision=precision)
    if kind == "blocked":
        return blocked(model.our_port(precision=precision))
    p = Precision.parse(precision)
    inner = model.our_port(precision=f"float32,kv={p.kv}" if p.kv != "float32" else None)
    return RecordedOnly(inner, getattr(torch, p.activations))


def _has_gpu() -> bool:
    import torch
    return torch.cuda.is_available()


def run_case(case: dict) -> dict:
    import torch
    torch.set_num_threads(1)
    from ladder.sides.judge import ModelUnderTest, judge
    from ladder.sweep.pooled import row_field
    model = ModelUnderTest.build(preset="tiny", seed=case["seed"])
    prec = case["precision"]
    port = _port(model, case["port"], None if prec == "float32" else prec)
    v = judge(port, model, prompt_len=case["prompt"], steps=case["steps"], locate=False,
              precision=prec)
    res = v.cmp.systematic
    return dict(case, passed=v.passed, failing=[r.text() for r in res if r.failed],
                findings=[r.text() for r in res if r.finding],
                tested=sum(1 for r in res if r.scale.p == r.scale.p),
                systematic=row_field(v.cmp))


def cases(seeds: int, f32_seeds: int, triton_seeds: int = 0, first: int = 0) -> list:
    out = []
    for prec in PRECISIONS:
        for kind in PORTS:
            if kind == "recorded" and prec == "float32,kv=int8":
                continue
            if kind == "triton":
                if prec in TRITON_PRECISIONS:
                    out += [dict(precision=prec, port=kind, seed=s, prompt=6, steps=12)
                            for s in range(first, first + triton_seeds)]
                continue
            out += [dict(precision=prec, port=kind, seed=s, prompt=p, steps=n)
                    for s in range(first, first + seeds) for p, n in SCHEDULES]
    out += [dict(precision="float32", port="ours", seed=s, prompt=p, steps=n)
            for s in range(first, first + f32_seeds) for p, n in SCHEDULES]
    return out


def main(argv=None) -> int:
    from ladder.sweep.pooled import pool
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--f32-seeds", type=int, default=34)
    ap.add_argument("--triton-seeds", type=int, default=4)
    ap.add_argument("--first-seed", type=int, default=0,
                    help="seeds from this one on (fresh models: a check not tuned on them)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    todo = cases(args.seeds, args.f32_seeds, args.triton_seeds, args.first_seed)
    if args.triton_seeds and not _has_gpu():
        os.environ.setdefault("TRITON_INTERPRET", "1")    # read when the workers import triton
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as ex:
        rows = list(ex.map(run_case, todo))
    print(f"{len(rows)} cases, -j {args.jobs}, 1 torch thread each, "
          f"{time.perf_counter() - t0:.0f} s")
    for i, r in enumerate(rows):
        r.update(index=i, id=f"{r['precision']}/{r['port']}/{r['seed']}/{r['prompt']}+"
                              f"{r['steps']}",
                 settings={"precision": r["precision"], "port": r["port"], "seed": r["seed"]})
    pools = {tuple(sorted(g["settings"].items())): g for g in pool(rows)}
    print(f"{'precision':17s} {'port':9s} {'cases':>5s} {'false alarms':>12s} "
          f"{'with findings':>13s} {'pooled: cases':>13s} {'failing':>7s} {'findings':>8s}")
    alarms = 0
    for prec in (*PRECISIONS, "float32"):
        for kind in PORTS:
            g = [r for r in rows if r["precision"] == prec and r["port"] == kind]
            if not g:
                continue
            pg = pools.get((("port", kind), ("precision", prec)))
            bad = sum(not r["passed"] for r in g)
            alarms += bad + (len(pg["failing"]) if pg else 0)
            print(f"{prec:17s} {kind:9s} {len(g):5d} {bad:12d} "
                  f"{sum(bool(r['findings']) for r in g):13d} "
                  f"{len(pg['cases']) if pg else 0:13d} "
                  f"{len(pg['failing']) if pg else 0:7d} {len(pg['findings']) if pg else 0:8d}")
            for x in (pg["failing"] if pg else []):
                print(f"    POOLED FALSE ALARM: {x.text()}")
            for x in (pg["findings"][:4] if pg else []):
                print(f"    pooled finding: {x.text()}")
    for r in rows:
        if not r["passed"]:
            print(f"FALSE ALARM: {r['id']}: {'; '.join(r['failing']) or 'a max-based rule'}")
    print(f"{alarms} false alarms over {len(rows)} cases and {len(pools)} pools")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "systematic"} for r in rows], f,
                      indent=1)
    return 0 if alarms == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
