"""A sweep's systematic statistics pooled over its cases (docs/precision.md, "Systematic errors").

One run compares each point at a few positions of one model. Two honest implementations at one
precision differ systematically *per model*: a weight or constant one rounds and the other
keeps is the same error at every position of that model (measured at bfloat16: up to 0.8 u at
a point, pooled over the schedules of one seed). So one run cannot tell a 0.3 % bug from the
model's own rounding luck, and its margin is u. Across models that luck has no direction, a
bug keeps its own: a sweep over seeds pools its cases with the *model* as the cluster (every
case of one parameter set summed into one cluster: sums of sums stay the fit's sufficient
statistics, systematic.Systematic), and tests the mean over models, its variance from their
spread. What is left of honest rounding then is an order's mean bias (measured up to 0.26 u
over 32 bfloat16 models), so a pool's margin is POOL_MARGIN of the run's.

Each case row carries its points' sums in the `systematic` field, contiguous positions merged
into at most CASE_CLUSTERS clusters per point, with the margins its own comparison used. Cases
pool when their settings agree apart from the schedule and the seed (POOL_FREE): the same
port, precision, weights and fault. Holm runs over every test of a pool, so each pool keeps
the comparison's family-wise rate.
"""
from __future__ import annotations

import math

import numpy as np

from ladder.engine.systematic import ALPHA, Systematic
from ladder.engine.systematic_sums import NCOLS

CASE_CLUSTERS = 8           # clusters a row keeps per point (~170 KB a tiny row)
MAX_POINTS = 8192           # points a row may declare (the shipped ladder has ~600)
POOL_FREE = ("seed", "prompt_len", "steps", "window")   # settings a pool spans
OLD_NCOLS = 8               # rows written before the iteration columns were added
POOL_MARGIN = 0.5           # of a run's margin: the per-model rounding luck averages out


def row_field(cmp):
    """The row's `systematic` field of a comparison, or None when it has no statistics."""
    sums = getattr(cmp, "sums", None)
    if sums is None or not cmp.systematic:
        return None
    unit = cmp.systematic[0].unit
    points = {}
    for res in cmp.systematic:
        s = sums.sums(res.point)
        groups = np.array_split(s, min(CASE_CLUSTERS, len(s))) if len(s) else []
        merged = [g.sum(0) for g in groups if len(g)]
        points[res.point] = {"margins": [res.scale.margin, res.bias.margin],
                             "sums": [[float(v) for v in c] for c in merged]}
    return {"unit": float(unit), "points": points}


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_field(v) -> str:
    """'' if `v` is a valid `systematic` field (None included), else what is wrong with it."""
    if v is None:
        return ""
    if not isinstance(v, dict) or set(v) != {"unit", "points"}:
        return "must be an object {unit, points} or null"
    if not (_finite(v["unit"]) and 0 <= v["unit"] < 1):
        return "unit must be a number in [0, 1)"
    pts = v["points"]
    if not isinstance(pts, dict) or len(pts) > MAX_POINTS:
        return f"points must be an object of at most {MAX_POINTS} points"
    for name, p in pts.items():
        if not isinstance(p, dict) or set(p) != {"margins", "sums"}:
            return f"points.{name} must be an object {{margins, sums}}"
        m, s = p["margins"], p["sums"]
        if not (isinstance(m, list) and len(m) == 2 and all(_finite(x) and x >= 0 for x in m)):
            return f"points.{name}.margins must be two numbers >= 0"
        if not (isinstance(s, list) and len(s) <= CASE_CLUSTERS and all(
                isinstance(c, list) and len(c) in (OLD_NCOLS, NCOLS) and all(map(_finite, c))
                for c in s)):
            return (f"points.{name}.sums must be at most {CASE_CLUSTERS} lists of {NCOLS} "
                    f"(or, from before the iteration columns, {OLD_NCOLS}) finite numbers")
    return ""


def _key(row) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in row["settings"].items() if k not in POOL_FREE))


def pool(rows: list) -> list:
    """[{"settings", "cases", "models", "points", "tested", "failing", "findings", "results"}]
    per group of cases with statistics over at least two models, in the order of their first
    case."""
    groups: dict = {}
    for r in sorted(rows, key=lambda r: r["index"]):
        if r.get("systematic"):
            groups.setdefault(_key(r), []).append(r)
    out = []
    for key, rs in groups.items():
        models: dict = {}                    # model -> point -> its one cluster
        margins: dict = {}
        for r in rs:
            model = models.setdefault(r.get("params_sha256") or f"seed {r['settings'].get('seed')}",
                                      {})
            for point, p in r["systematic"]["points"].items():
                if p["sums"]:
                    one = np.zeros(NCOLS)
                    for c in p["sums"]:
                        one[:len(c)] += c
                    model[point] = model[point] + one if point in model else one
                old = margins.get(point, (0.0, 0.0))
                margins[point] = (max(old[0], p["margins"][0]), max(old[1], p["margins"][1]))
        if len(models) < 2:
            continue
        sysm = Systematic()
        for point in margins:
            got = [m[point] for m in models.values() if point in m]
            if got:
                sysm.add(point, np.stack(got))
        unit = max(r["systematic"]["unit"] for r in rs)
        results = sysm.finish(lambda pt: tuple(POOL_MARGIN * m for m in margins[pt]), unit,
                              f"models over {len(rs)} cases")
        out.append({"settings": dict(key), "cases": [r["id"] for r in rs],
                    "models": len(models),
                    "tested": sum(1 for x in results if x.scale.p == x.scale.p),
                    "points": len(results), "results": results,
                    "failing": [x for x in results if x.failed],
                    "findings": [x for x in results if x.finding]})
    return out


def to_json(groups: list) -> list:
    return [{"settings": g["settings"], "cases": len(g["cases"]), "models": g["models"],
             "points": g["points"],
             "tested": g["tested"], "failing": [x.to_dict() for x in g["failing"]],
             "findings": [x.to_dict() for x in g["findings"]]} for g in groups]


def markdown(groups: list) -> list:
    """The report's section (lines), empty without a pool."""
    if not groups:
        return []
    out = ["", "## Systematic errors, pooled over cases", "",
           f"Cases whose settings agree apart from {', '.join(POOL_FREE)} pool their sums, one "
           f"cluster per model (parameter set); margins {POOL_MARGIN:g} of a run's; Holm over "
           f"each pool's tests, family-wise alpha {ALPHA:g}.", ""]
    for g in groups:
        what = ", ".join(f"{k}={v}" for k, v in g["settings"].items()) or "every case"
        out.append(f"- {what}: {len(g['cases'])} cases of {g['models']} models, "
                   f"{g['tested']} of {g['points']} points "
                   f"tested: {len(g['failing'])} failing, {len(g['findings'])} findings")
        out += [f"    - FAIL {x.text()}" for x in g["failing"]]
        out += [f"    - finding {x.text()}" for x in g["findings"][:10]]
    return out


def summary_lines(groups: list) -> list:
    return [f"  pooled systematic FAIL ({len(g['cases'])} cases): {x.text()}"
            for g in groups for x in g["failing"][:5]]
