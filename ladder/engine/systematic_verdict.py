"""A comparison's systematic statistics turned into verdicts (systematic.py): each point's
estimates in ladder order, and a material one failing the point's first row (the row is
where `locate` and the tables find the point; its note carries the estimate)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ladder.engine.rule_tables import UNIT_EPS, systematic_margins
from ladder.engine.systematic import ALPHA, ladder_point, own_key
from ladder.engine.systematic_sums import DIRECTION, direction_sums, position_sums

MARK = "systematic: "


def judge_systematic(cmp, sysm, precision, own=None):
    """Set cmp.systematic (and cmp.sums) from `sysm`, failing the rows of material points.
    `own`: the own-op sums of the same points (ladder/sides/own_error.py), tested in the same
    Holm family under their own keys (systematic.own_key)."""
    if own is not None:
        for point in own.points():
            sysm.add(own_key(point), own.sums(point))
    scale_m, bias_m = systematic_margins(precision)
    act = "float32" if precision is None else precision.activations
    rs = cmp.rules

    def margins(point):
        # a point's rule states the relative error it tolerates: a systematic error inside
        # that is not material either (a rule loosened for a point loosens its margin)
        rtol = rs.rules[rs.pattern_for(f"{cmp.prefix}/{ladder_point(point)}")].rtol
        return max(scale_m, rtol), max(bias_m, rtol)
    results = sysm.finish(margins, UNIT_EPS[act])
    order = {p: i for i, p in enumerate(cmp.point_order or
                                        dict.fromkeys(r.point for r in cmp.rows))}
    results.sort(key=lambda r: (order.get(ladder_point(r.point), len(order)), r.own))
    cmp.systematic, cmp.sums = results, sysm
    for res in results:
        if res.failed:
            _fail_first_row(cmp, res)


def _fail_first_row(cmp, res):
    i = next((k for k, r in enumerate(cmp.rows) if r.point == ladder_point(res.point)), None)
    if i is None:
        return
    row = cmp.rows[i]
    note = "; ".join(n for n in (MARK + res.text(), row.note) if n)
    if row.passed and cmp.folded:
        cmp.total_failing += 1
        cmp.fail_counts[row.point] = cmp.fail_counts.get(row.point, 0) + 1
    first_bad = row.first_bad_pos if row.first_bad_pos is not None else row.pos0
    cmp.rows[i] = replace(row, passed=False, first_bad_pos=first_bad, note=note)


def is_systematic(row) -> bool:
    """Whether `row` fails by its systematic statistics alone (its worst element inside
    the rule): what locate cannot re-run at one position."""
    return row.note.startswith(MARK) and row.error <= 1.0


def systematic_text(results: list) -> str:
    """The comparison's summary line, then one line per failing point and per finding."""
    fails = [r for r in results if r.failed]
    finds = [r for r in results if r.finding]
    tested = sum(1 for r in results if r.scale.p == r.scale.p)
    head = (f"systematic: {tested} of {len(results)} points tested (scale, bias, rounding "
            f"direction, an iterative op's iteration count; Holm over all, family-wise alpha {ALPHA:g}): {len(fails)} failing, "
            f"{len(finds)} findings below the margin")
    lines = [head] + [f"    FAIL     {r.text()}" for r in fails] + \
        [f"    finding  {r.text()}" for r in finds[:10]]
    if len(finds) > 10:
        lines.append(f"    ... {len(finds) - 10} more findings")
    return "\n".join(lines)


def systematic_verdict(cmp, first) -> str:
    """locate's verdict on a point that fails by its statistics: a re-run at one position
    cannot show an error that only its repetition over positions makes certain, so the split
    is read off the ladder instead: every earlier point was tested and none is material."""
    here = [r for r in cmp.systematic if ladder_point(r.point) == first.point]
    mine = next((r for r in here if r.failed), here[0] if here else None)
    before = []
    for r in cmp.systematic:
        if ladder_point(r.point) == first.point:
            break
        before.append(r)
    found = [r.point for r in before if r.finding]
    tail = (f"; findings below the margin before it: {', '.join(found[:6])}"
            if found else "")
    if mine is not None and mine.own:
        return (f"{mine.text()}. The op's own error: the reference's op, fed the port's own "
                f"recorded inputs, departs from what the port recorded the same way at every "
                f"position{tail}")
    return (f"{mine.text() if mine else first.point}. The layer's own error: each of the "
            f"{len(before)} points before it in ladder order was tested the same way and none "
            f"is past its margin{tail}")


def point_sums(sysm, point: str, va, vb, fv, direction=None):
    """The systematic sums of a point measured one by one (16-bit, logits, ...): float
    values of one shape, all finite (a NaN/Inf fails the row on its own). `direction`: an
    iterative op's (stored replay, one-iteration-short change), each of vb's shape, for
    systematic_sums.direction_sums."""
    vf = vb if fv is None else fv
    if not (va.is_floating_point() and vb.is_floating_point() and vf.is_floating_point()) \
            or va.shape != vb.shape or vf.shape != vb.shape or va.ndim < 1 or not va.numel():
        return
    a, b = (t.detach().cpu().double() for t in (va, vb))
    f = b if fv is None else fv.detach().cpu().double()
    with np.errstate(all="ignore"):
        s = position_sums(a.numpy(), b.numpy(), f.numpy())
    if not np.isfinite(s).all():     # a NaN or Inf anywhere in a, b or f reaches the sums
        return
    if direction is not None:
        stored, g = (t.detach().cpu().double() for t in direction)
        if stored.shape == a.shape and g.shape == a.shape and torch.isfinite(stored).all() \
                and torch.isfinite(g).all():
            s[:, DIRECTION] = direction_sums(a.numpy(), stored.numpy(), g.numpy())
    sysm.add(point, s)


