"""Rows of a comparison made only when kept: a streamed comparison of ~10^5 (step, point)
pairs keeps a few rows a point (compare.py keep="summary"), and building every PointResult,
cosine and SQNR included, would cost more than measuring them.

A `LazyRow` holds what the fold decides by (the point, its rule error, its verdict) and
builds the full row from its step's batch (batch.Measured) on demand; the fold asks for it
while the step's values are still in memory, and only for the rows it keeps.
"""
from __future__ import annotations

import math


class LazyRow:
    """A row measured by the batch, built into a PointResult when kept."""
    __slots__ = ("point", "error", "passed", "_args", "_row")

    def __init__(self, point, error, args):
        self.point, self.error, self.passed = point, error, error <= 1.0
        self._args, self._row = args, None

    def build(self):
        if self._row is None:
            make, batch, i, rest = self._args
            self._row = make(batch, i, *rest)
            self._args = None                 # the step's arrays are not held past this
        return self._row


def built(r):
    return r.build() if isinstance(r, LazyRow) else r


class Fold:
    """keep="summary": rows folded step by step into what the verdicts read (each point's
    worst row and first failing one, the first failing step whole, counts of the rest)."""

    def __init__(self):
        self.worst, self.first_fail, self.first_step = {}, {}, None
        self.order, self.total, self.failing, self.counts = {}, 0, 0, {}

    def add(self, si: int, step_rows: list):
        """Step si's rows, PointResult or LazyRow, in ladder order."""
        if not step_rows:
            return
        bad = not all(r.passed for r in step_rows)
        if bad and self.first_step is None:
            step_rows = [built(r) for r in step_rows]
            self.first_step = step_rows
        for j, r in enumerate(step_rows):
            self.total += 1
            err = math.inf if math.isnan(r.error) else r.error
            w = self.worst.get(r.point)
            if w is None or err > (math.inf if math.isnan(w.error) else w.error):
                r = built(r)
                self.worst[r.point] = r
                self.order[id(r)] = (si, j)
            if not r.passed:
                self.failing += 1
                self.counts[r.point] = self.counts.get(r.point, 0) + 1
                if r.point not in self.first_fail:
                    r = built(r)
                    self.first_fail[r.point] = r
                    self.order[id(r)] = (si, j)
        if self.first_step is step_rows:
            for j, r in enumerate(step_rows):
                self.order[id(r)] = (si, j)

    def finish(self, cmp):
        kept = {id(r): r for r in (self.first_step or [])}
        kept.update({id(r): r for r in self.worst.values()})
        kept.update({id(r): r for r in self.first_fail.values()})
        cmp.rows = sorted(kept.values(), key=lambda r: self.order[id(r)])
        cmp.folded, cmp.total_rows, cmp.total_failing = True, self.total, self.failing
        cmp.fail_counts = dict(self.counts)
        cmp.point_order = list(self.worst)        # first appearance, as the full rows give
