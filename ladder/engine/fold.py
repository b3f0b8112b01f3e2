"""keep="summary": a long comparison's rows folded step by step into what its verdicts read
(each point's worst and first failing row, the first failing step whole), so memory does not
grow with the number of steps (compare.py, `compare_ladders`)."""
from __future__ import annotations

import math


class Fold:
    """keep="summary": rows folded step by step into what the verdicts read."""

    def __init__(self):
        self.worst, self.first_fail, self.first_step = {}, {}, None
        self.order, self.total, self.failing, self.counts = {}, 0, 0, {}

    def add(self, si: int, step_rows: list):
        if not step_rows:
            return
        si -= 1                                   # the rows are the previous step's
        bad = False
        for j, r in enumerate(step_rows):
            self.order[id(r)] = (si, j)
            self.total += 1
            err = math.inf if math.isnan(r.error) else r.error
            w = self.worst.get(r.point)
            if w is None or err > (math.inf if math.isnan(w.error) else w.error):
                self.worst[r.point] = r
            if not r.passed:
                bad = True
                self.failing += 1
                self.counts[r.point] = self.counts.get(r.point, 0) + 1
                self.first_fail.setdefault(r.point, r)
        if bad and self.first_step is None:
            self.first_step = step_rows

    def finish(self, cmp):
        kept = {id(r): r for r in (self.first_step or [])}
        kept.update({id(r): r for r in self.worst.values()})
        kept.update({id(r): r for r in self.first_fail.values()})
        cmp.rows = sorted(kept.values(), key=lambda r: self.order[id(r)])
        cmp.folded, cmp.total_rows, cmp.total_failing = True, self.total, self.failing
        cmp.fail_counts = dict(self.counts)
        cmp.point_order = list(self.worst)        # first appearance, as the full rows give
