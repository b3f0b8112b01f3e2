"""Tolerance tables: one pandas row per (step, point), plus text / markdown / CSV renderings.

Columns: the metrics of compare.py, the rule that judged the point, the pass flag, a marker
on the first divergence, and `growth`: max|a-b| over the same point one layer earlier at the
same step (how the error grows through depth; NaN where there is no earlier layer or it was
exactly zero). `summary` folds the steps: per point its worst step. Three-way (a noise floor
beside the reference, docs/precision.md): `floor_abs`, the floor's own max|floor-b|, and
`noise_ratio`, the candidate's max|a-b| in noise units; the terminal shows both.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd


COLUMNS = ["step", "point", "layer", "coarse", "shape", "error", "passed", "first_fail",
           "max_abs", "max_rel", "ulp", "cosine", "one_minus_cos", "sqnr_db", "mismatch",
           "nan_a", "nan_b", "inf_a", "inf_b", "rule", "rtol", "atol", "floor", "scale", "stat",
           "growth", "worst_pos", "first_bad_pos", "note", "floor_abs", "noise_ratio", "noise"]

# What `python -m ladder run` prints; the CSV/HTML keep every column.
BRIEF = ["point", "step", "error", "max_abs", "max_rel", "ulp", "one_minus_cos", "sqnr_db",
         "rule", "passed"]
SUMMARY = ["point", "worst_step", "error", "max_abs", "max_rel", "ulp", "one_minus_cos",
           "sqnr_db", "rule", "passed", "failing_steps"]


def frame(cmp: "Comparison") -> pd.DataFrame:
    first = cmp.first
    prev: dict = {}
    recs = []
    for r in cmp.rows:
        growth = math.nan
        if r.layer is not None:
            name = r.point.split(".", 1)[1]
            before = prev.get((r.step, r.layer - 1, name))
            if before and math.isfinite(before) and math.isfinite(r.max_abs):
                growth = r.max_abs / before
            prev[(r.step, r.layer, name)] = r.max_abs
        recs.append(dict(
            step=r.step, point=r.point, layer=-1 if r.layer is None else r.layer,
            coarse=r.coarse, shape="x".join(str(s) for s in r.shape), error=r.error,
            passed=r.passed, first_fail=first is not None and r.key == first.key,
            max_abs=r.max_abs, max_rel=r.max_rel, ulp=r.ulp, cosine=r.cosine,
            one_minus_cos=1.0 - r.cosine,
            sqnr_db=r.sqnr_db, mismatch=r.mismatch, nan_a=r.nan_a, nan_b=r.nan_b,
            inf_a=r.inf_a, inf_b=r.inf_b, rule=r.pattern, rtol=r.rule.rtol, atol=r.rule.atol,
            floor=r.rule.floor,
            scale=r.rule.scale, stat=r.rule.stat, growth=growth, worst_pos=r.worst_pos,
            first_bad_pos=-1 if r.first_bad_pos is None else r.first_bad_pos, note=r.note,
            floor_abs=r.floor_abs, noise_ratio=r.noise_ratio, noise=r.rule.noise))
    df = pd.DataFrame(recs, columns=COLUMNS)
    if cmp.folded:                    # a summary comparison counts its failing steps itself
        df.attrs["fail_counts"] = dict(cmp.fail_counts)
        df.attrs["point_order"] = list(cmp.point_order)
    return df


def summary(df: pd.DataFrame, coarse_only: bool = False) -> pd.DataFrame:
    """Per point (ladder order of the first step): the row of its worst step (`worst_step`),
    with `passed` over all steps and `failing_steps`."""
    if coarse_only:
        df = df[df["coarse"]]
    order = df.attrs.get("point_order") or list(dict.fromkeys(df["point"]))
    out = []
    for point, g in df.groupby("point", sort=False):
        worst = g.loc[g["error"].fillna(math.inf).idxmax()].copy()
        worst["passed"] = bool(g["passed"].all())
        worst["first_fail"] = bool(g["first_fail"].any())
        counts = df.attrs.get("fail_counts")
        worst["failing_steps"] = counts.get(point, 0) if counts is not None else \
            int((~g["passed"]).sum())
        out.append(worst)
    res = pd.DataFrame(out)
    if res.empty:
        return res
    res["_o"] = res["point"].map({p: i for i, p in enumerate(order)})
    res = res.sort_values("_o").drop(columns="_o").reset_index(drop=True)
    return res.rename(columns={"step": "worst_step"})


# One line for every rendering that shows (or ships, as the CSV does) the growth column.
GROWTH_LEGEND = ("growth: max|a-b| at this point over max|a-b| at the same point one layer "
                 "earlier, same step (above 1: the error grows with depth; - where there is no "
                 "earlier layer or its error was exactly zero)")

HEADERS = {"passed": "result", "one_minus_cos": "1-cos", "worst_step": "worst at",
           "failing_steps": "failing", "first_fail": "first", "floor_abs": "floor|f-b|",
           "noise_ratio": "x floor"}


def fmt_number(v, col: str) -> str:
    if isinstance(v, (bool, np.bool_)):
        if col == "passed":
            return "pass" if v else "FAIL"
        return ("<<" if v else "") if col == "first_fail" else ("yes" if v else "no")
    if isinstance(v, float):
        if col == "error" and not math.isfinite(v):
            return "unbounded"             # NaN/Inf capture or a missing point (see note)
        if math.isnan(v):
            return "-"
        if col == "cosine":
            return f"{v:.9f}"
        if col in ("sqnr_db",):
            return "exact" if v == math.inf else f"{v:.1f}"      # no noise at all
        if col == "ulp":
            return f"{v:.0f}" if v < 1e6 else f"{v:.2e}"
        return f"{v:.3g}"
    return str(v)


def _cells(df: pd.DataFrame, cols) -> list:
    return [[fmt_number(row[c], c) for c in cols] for _, row in df.iterrows()]


def three_way(cols: list, df: pd.DataFrame) -> list:
    """`cols` with the noise floor's columns after max_abs when the rows have a floor."""
    if "floor_abs" not in df.columns or not df["floor_abs"].notna().any() \
            or "floor_abs" in cols or "max_abs" not in cols:
        return list(cols)
    at = cols.index("max_abs") + 1
    return cols[:at] + ["floor_abs", "noise_ratio"] + cols[at:]


def to_text(df: pd.DataFrame, cols=None) -> str:
    """A fixed-width table for the terminal."""
    cols = [c for c in three_way(list(cols or (SUMMARY if "worst_step" in df.columns
                                               else BRIEF)), df) if c in df.columns]
    cells = _cells(df, cols)
    head = [HEADERS.get(c, c) for c in cols]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(head)]
    right = lambda c: c not in ("point", "step", "worst_step", "rule", "note", "shape", "passed")
    line = lambda vals: "  ".join(v.rjust(w) if right(c) else v.ljust(w)
                                  for v, w, c in zip(vals, widths, cols)).rstrip()
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in cells])


def to_markdown(df: pd.DataFrame, cols=None) -> str:
    """GitHub-flavoured markdown (written here: pandas' to_markdown needs `tabulate`)."""
    cols = [c for c in (cols or list(df.columns))]
    esc = lambda s: s.replace("|", "\\|")
    out = ["| " + " | ".join(HEADERS.get(c, c) for c in cols) + " |",
           "|" + "|".join("---:" if df[c].dtype.kind in "fi" else "---" for c in cols) + "|"]
    out += ["| " + " | ".join(esc(v) for v in r) + " |" for r in _cells(df, cols)]
    return "\n".join(out) + "\n"


def to_csv(df: pd.DataFrame, path) -> None:
    # repr-exact floats: a CSV someone reloads must hold the numbers, not their rounding.
    df.to_csv(path, index=False, float_format="%.17g", lineterminator="\n")
