"""Compare two ladders point by point (docs/design.md "Comparison rules").

Per point: max |a-b|, max relative error with a floored denominator, ULP distance in the
compared dtype, cosine similarity, SQNR in dB, mismatch fraction, NaN/Inf counts each way,
and the rule's statistic as a fraction of its allowance. A point passes when every position
of the step passes its rule (positions are judged one by one, so a prefill position and a
decode position get the same bound). Logits also get argmax and top-k agreement with a
near-tie margin, and KL divergence. NaN or Inf is a failing point, never an exception.

`a` is the candidate (the port), `b` the reference whose magnitudes scale the bounds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from ladder.engine.batch import (as_array, batchable, chunks, eligible, floor_array, measure,
                                 pair)
from ladder.engine.fold import Fold, LazyRow
from ladder.engine.metrics import metrics
from ladder.engine.ladder_text import (first_bit_difference, hidden_text,  # noqa: F401
                                       merged_order)
from ladder.engine.three_way import FloorBatch, NoFloorError, floor_at, three_way
from ladder.engine.rules import DEFAULT_RULES, Rule, RuleSet
from ladder.engine.systematic import Systematic
from ladder.engine.systematic_verdict import judge_systematic, point_sums, systematic_text
from ladder.engine.trace import Ladder, TAIL, is_coarse, layer_of


class CompareError(ValueError):
    """Two ladders that cannot be compared (different schedules): bad input, not divergence."""


@dataclass(frozen=True)
class PointResult:
    step: str
    point: str
    shape: tuple
    max_abs: float
    max_rel: float
    ulp: float
    cosine: float
    sqnr_db: float
    mismatch: float
    nan_a: int
    nan_b: int
    inf_a: int
    inf_b: int
    pattern: str
    rule: Rule
    error: float               # worst position's rule statistic / allowance (pass: <= 1)
    passed: bool
    worst_pos: int             # absolute position of the largest error
    first_bad_pos: int | None  # first absolute position that fails
    note: str = ""
    pos0: int = 0              # absolute position of the step's first position
    errors: tuple = ()         # rule error / allowance at each position of the step
    # three-way (a noise floor beside the reference): the floor's max|floor-b|, and the
    # largest ratio of the candidate's max|a-b| to the noise unit over the step's positions
    floor_abs: float = math.nan
    noise_ratio: float = math.nan
    units: tuple = ()          # the noise unit at each position (noise_units), three-way only

    def error_at(self, pos: int) -> float:
        """The rule error at absolute position `pos` (the step's worst when not recorded)."""
        j = pos - self.pos0
        return self.errors[j] if 0 <= j < len(self.errors) else self.error

    @property
    def first_bad_error(self) -> float:
        """The error at the first failing position: the number `locate` re-runs and shows."""
        return self.error if self.first_bad_pos is None else self.error_at(self.first_bad_pos)

    @property
    def key(self) -> str:
        return f"{self.step}/{self.point}"

    @property
    def layer(self):
        return layer_of(self.point)

    @property
    def coarse(self) -> bool:
        return is_coarse(self.point)

    def __str__(self):
        """A passing row shows its worst position's error; a failing row its first failing
        position's (the one `locate` re-runs), then the worst when that is elsewhere."""
        flag = "pass" if self.passed else "FAIL"
        failing = not self.passed and self.first_bad_pos is not None
        err = self.first_bad_error if failing else self.error
        s = (f"{self.key:22s} {flag}  err {error_text(err):>9s} of allowance  max|a-b| "
             f"{self.max_abs:9.3g}  rel {self.max_rel:9.3g}  ulp {self.ulp:8.3g}  "
             f"1-cos {1 - self.cosine:8.2g}  [{self.pattern}: {self.rule.describe()}]")
        if failing:
            s += f"  first failing position {self.first_bad_pos}"
            if self.worst_pos != self.first_bad_pos and err != self.error:
                s += f" (worst {error_text(self.error)} at position {self.worst_pos})"
        return s + (f"  ({self.note})" if self.note else "")


def error_text(err: float) -> str:
    """An error of allowance for the screen: rules floor every allowance, so only a NaN/Inf
    capture or a missing point is unbounded, and it is said in words, not as `inf`."""
    if math.isfinite(err):
        return f"{err:.3g}"
    return "unbounded"


@dataclass(frozen=True)
class LogitsResult:
    step: str
    pos: int
    argmax_a: int
    argmax_b: int
    near_tie: bool             # argmaxes differ, but within the tie margin in the reference
    topk_agree: bool           # top-k sets equal up to near ties at the k-th boundary
    kl: float                  # KL(softmax(b) || softmax(a)), nats
    kl_bound: float            # allowance²/2 (Hoeffding): implied by the logits rule
    passed: bool

    @property
    def argmax_agree(self) -> bool:
        return self.argmax_a == self.argmax_b


def compare_point(step: str, point: str, a, b, pattern: str, rule: Rule, rel_floor: float,
                  pos0: int = 0, floor=None, units=None) -> PointResult:
    """One point of one step: a, b are [S, ...]; position j is absolute position pos0 + j.
    `floor`, `units`: the noise floor's values there and the noise unit at each position
    (noise_units; three-way, which a noise-unit rule needs)."""
    if a.shape != b.shape:
        return _missing(step, point, tuple(b.shape), pattern, rule,
                        f"shape {list(a.shape)} vs reference {list(b.shape)}")
    # numpy has no bfloat16 (and the ULP count reads float32 bits): 16-bit floats are
    # compared as float32, exactly (every bfloat16/float16 value is a float32), and said so.
    half = [f"{side} is {str(t.dtype)[6:]}" for side, t in (("a", a), ("b", b))
            if t.dtype in (torch.bfloat16, torch.float16)]
    if half:
        a, b = a.float(), b.float()
    m = metrics(a, b, rel_floor)
    ratios = rule.position_ratios(a, b, units)
    errs = rule.position_errors(a, b, ratios)
    row = _result(step, point, tuple(a.shape), a.numel(), m, errs, int((ratios > 1).sum()),
                  pattern, rule, pos0, half)
    return row if floor is None else three_way(row, a, b, floor, units)


def _result(step, point, shape, numel, m, errs, bad, pattern, rule, pos0, half=()):
    """The row of one measured point (metrics, the rule error per position, the count of
    elements over their allowance), whichever path measured it (this module or batch.py)."""
    worst = max(range(len(errs)), key=lambda j: errs[j]) if errs else 0
    first_bad = next((j for j, e in enumerate(errs) if not e <= 1.0), None)
    error = max(errs) if errs else 0.0
    nonfinite = m["nan_a"] + m["nan_b"] + m["inf_a"] + m["inf_b"]
    return PointResult(step, point, shape, m["max_abs"], m["max_rel"], m["ulp"],
                       m["cosine"], m["sqnr_db"], bad / max(numel, 1), m["nan_a"],
                       m["nan_b"], m["inf_a"], m["inf_b"], pattern, rule, error,
                       error <= 1.0, pos0 + worst,
                       None if first_bad is None else pos0 + first_bad,
                       "; ".join(([f"compared as float32 ({', '.join(half)}; ulp in "
                                   f"float32 units)"] if half else []) +
                                 (["NaN/Inf in a capture"] if nonfinite else [])),
                       pos0, tuple(errs))


def _missing(step, point, shape, pattern, rule, note) -> PointResult:
    nan = math.nan
    return PointResult(step, point, shape, nan, nan, nan, nan, nan, 1.0, 0, 0, 0, 0, pattern,
                       rule, math.inf, False, -1, None, note)


def compare_logits(step: str, pos: int, a, b, rule: Rule, ruleset: RuleSet,
                   unit: float = 0.0) -> LogitsResult:
    """Argmax/top-k agreement and KL for one position's logits [V]; `unit`: the noise unit
    at the position (a noise-unit rule's allowance is at least noise x unit)."""
    a64, b64 = a.double(), b.double()
    if not (torch.isfinite(a64).all() and torch.isfinite(b64).all()):
        return LogitsResult(step, pos, -1, -1, False, False, math.nan, 0.0, False)
    scale = b64.abs().max() if rule.scale == "maxabs" else b64.abs()
    allow = (rule.allowance(scale) * torch.ones_like(b64)).clamp_min(rule.noise * unit)
    tie = ruleset.logits.tie_factor / 2
    ia, ib = int(a64.argmax()), int(b64.argmax())
    near = ia != ib and float(b64[ib] - b64[ia]) <= tie * float(allow[ia] + allow[ib])
    k = min(ruleset.logits.topk, b64.numel())
    ta, tb = set(a64.topk(k).indices.tolist()), set(b64.topk(k).indices.tolist())
    kth = float(b64.topk(k).values[-1])
    topk_ok = all(abs(float(b64[i]) - kth) <= 2 * tie * float(allow[i]) for i in ta ^ tb)
    lp, lq = torch.log_softmax(b64, -1), torch.log_softmax(a64, -1)
    kl = max(float((lp.exp() * (lp - lq)).sum()), 0.0)
    bound = float(allow.max()) ** 2 / 2
    ok = (ia == ib or near) and topk_ok and kl <= bound
    return LogitsResult(step, pos, ia, ib, near, topk_ok, kl, bound, ok)


@dataclass
class Comparison:
    rows: list
    logits: list
    rules: RuleSet
    prefix: str
    a_label: str
    b_label: str
    steps: list = field(default_factory=list)
    hidden: list = field(default_factory=list)   # ("{step}/{point}", why): fused away, unjudged
    # keep="summary" (a long streamed comparison): `rows` holds, per point, its worst row and
    # its first failing one, plus every row of the first failing step; these count the rest.
    folded: bool = False
    total_rows: int = 0
    total_failing: int = 0
    fail_counts: dict = field(default_factory=dict)     # point -> failing steps
    point_order: list = field(default_factory=list)
    precision: object = None        # the candidate's declared precision (three-way), or None
    floor_label: str | None = None  # the noise floor's label, when one was compared
    # systematic.PointSystematic per point (ladder order): scale, bias, rounding direction,
    # iteration count
    systematic: list = field(default_factory=list)
    sums: object = None             # the systematic.Systematic they came from (sweeps pool it)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    @property
    def failures(self) -> list:
        return [r for r in self.rows if not r.passed]

    @property
    def first(self):
        """The first divergence: the earliest failing point in ladder order (or None)."""
        return next((r for r in self.rows if not r.passed), None)

    @property
    def first_coarse(self):
        return next((r for r in self.rows if not r.passed and r.coarse), None)

    def row(self, step: str, point: str) -> PointResult:
        for r in self.rows:
            if r.step == step and r.point == point:
                return r
        raise KeyError(f"no row {step}/{point}")

    def worst(self):
        """The row with the largest error (never smaller than the first divergence's: an
        unbounded row, NaN/Inf or missing, counts as the largest; ties go to the earliest)."""
        if not self.rows:
            return None
        key = lambda r: math.inf if math.isnan(r.error) else r.error
        return max(self.rows, key=key)

    def to_frame(self):
        from ladder.engine.table import frame
        return frame(self)

    def __str__(self):
        n_fail = self.total_failing if self.folded else len(self.failures)
        n_rows = self.total_rows if self.folded else len(self.rows)
        lines = [f"{self.a_label} vs {self.b_label}: {n_rows} points over "
                 f"{len(self.steps)} steps, {n_fail} failing "
                 f"({'PASS' if not n_fail else 'DIVERGENCE'})"]
        if self.folded:
            lines.append(f"  streamed: {len(self.rows)} rows kept (each point's worst and first "
                         f"failing step, and the first failing step whole)")
        w = self.worst()
        if w is not None:
            lines.append(f"  worst:  {w}")
        if self.hidden:
            lines.append("  " + hidden_text(self.hidden))
        if self.first is not None:
            lines.append(f"  first divergence: {self.first}")
        if self.systematic:
            lines.append("  " + systematic_text(self.systematic))
        if self.logits:
            agree = sum(r.argmax_agree for r in self.logits)
            ties = sum(r.near_tie for r in self.logits)
            topk = sum(r.topk_agree for r in self.logits)
            kl = max((r.kl for r in self.logits), default=0.0)
            lines.append(f"  logits: argmax {agree}/{len(self.logits)} agree ({ties} near "
                         f"ties), top-{self.rules.logits.topk} {topk}/{len(self.logits)}, "
                         f"max KL {kl:.3g} nats")
        return "\n".join(lines)


def as_ruleset(rules) -> RuleSet:
    return rules if isinstance(rules, RuleSet) else RuleSet(rules=dict(rules))


def schedule_difference(a: Ladder, b: Ladder) -> str:
    """The first step at which two ladders' schedules differ, and in what ('' if none)."""
    for i, (x, y) in enumerate(zip(a.steps, b.steps)):
        for field_name in ("name", "pos", "tokens"):
            u, v = getattr(x, field_name), getattr(y, field_name)
            if tuple(u) != tuple(v) if field_name == "tokens" else u != v:
                return (f"step {i} has {field_name} {str(u)[:60]} in {a.label!r}, "
                        f"{str(v)[:60]} in {b.label!r}")
    if len(a.steps) != len(b.steps):
        return f"{len(a.steps)} steps in {a.label!r}, {len(b.steps)} in {b.label!r}"
    return ""


def compare_ladders(a: Ladder, b: Ladder, rules=DEFAULT_RULES, prefix: str = "port",
                    a_label=None, b_label=None, keep: str = "all", floor: Ladder | None = None,
                    unit_eps: float = 0.0, precision=None, own=None) -> Comparison:
    """Every (step, point) of `a` against `b` under rules matched on `{prefix}/{point}`.

    `floor`: a noise floor (the reference at the candidate's precision, same schedule): each
    row then also holds the floor's error and the candidate's in noise units, and noise-unit
    rules allow `noise` x max(floor error so far, unit_eps x max|b|) (docs/precision.md).
    Such rows go through the step's batch too (batch.py, three_way.batch_units) where it
    takes the point; the logits and NaN/Inf cases are measured point by point.

    keep="all": a row per (step, point). keep="summary": what a long comparison needs and no
    more (Comparison.folded): the first divergence, each point's worst, and the first failing
    step whole, so memory does not grow with the number of steps.

    Beside the rows, every float point's systematic statistics over all positions
    (systematic.py) are judged against the margins of `precision` (the candidate's declared
    Precision; None: float32): a material scale or bias fails the point's first row. `own`:
    the same statistics of each point's own op (a systematic.Systematic keyed by point: the
    candidate against the yardstick's op re-run on the candidate's recorded inputs, which a
    model-aware caller computes, ladder/sides/own_error.py), tested in one family with them."""
    if keep not in ("all", "summary"):
        raise CompareError(f"keep={keep!r}; one of 'all', 'summary'")
    rs = as_ruleset(rules)
    why = schedule_difference(a, b)
    if why:
        raise CompareError(f"ladders {a.label!r} and {b.label!r} come from different token "
                           f"schedules: {why}; compare runs of the same tokens")
    if floor is not None:
        why = schedule_difference(floor, b)
        if why:
            raise CompareError(f"the noise floor {floor.label!r} and {b.label!r} come from "
                               f"different token schedules: {why}")
    if a.captured != b.captured or (floor is not None and floor.captured != b.captured):
        a, b = a.last_only(), b.last_only()     # one side kept each step's last position only
        floor = None if floor is None else floor.last_only()
    rows, logit_rows, hidden, patterns = [], [], [], {}
    seen = {}                  # point -> the noise floor's largest error so far (noise_units)
    sysm = Systematic()
    fold = Fold() if keep == "summary" else None
    for si, st in enumerate(b.steps):
        pos0 = b.first_pos(st)
        step_rows, batch, out = [], {}, []
        in_a, in_b = _arrays(a, st.name), _arrays(b, st.name)
        in_f = None if floor is None else _arrays(floor, st.name)
        for point in merged_order(a, b, st.name):
            key = f"{st.name}/{point}"
            pattern = patterns.get(point)
            if pattern is None:
                pattern = patterns[point] = rs.pattern_for(f"{prefix}/{point}")
            if point not in in_a or point not in in_b:
                why = a.hidden.get(key) if point not in in_a else b.hidden.get(key)
                if why is not None:
                    hidden.append((key, why))
                    continue
                side = a.label if point not in in_a else b.label
                shape = tuple((b if point in in_b else a)[key].shape)
                step_rows.append(_missing(st.name, point, shape, pattern, rs.rules[pattern],
                                          f"not traced by {side}"))
                continue
            if batchable(rs.rules[pattern]) and (floor is None or point != TAIL[-1]):
                x, y, half = pair(a, b, key, in_a[point], in_b[point])
                fz = None if floor is None else floor_array(floor, key, in_f, point, y)
                if eligible(x, y) and (floor is None or fz is not None):
                    batch.setdefault(x.dtype, []).append(
                        (len(step_rows), point, x, y, pattern, half, fz))
            step_rows.append((point, key, pattern))
        # every point of the step at once (batch.py); what it leaves, one by one below
        done = {}
        for whole in batch.values():
            for lo, hi in chunks([g[2].size for g in whole]):
                group = whole[lo:hi]
                fb = None if floor is None else FloorBatch(
                    [g[6] for g in group], [seen.get(g[1], 0.0) for g in group], unit_eps)
                kept, measured = measure([(g[2], g[3]) for g in group],
                                         [rs.rules[g[4]] for g in group], rs.rel_floor, fb)
                if kept:
                    measured.add_systematic(sysm, [group[g][1] for g in kept])
                for k, g in enumerate(kept):
                    i, point, x, _, pattern, half, _ = group[g]
                    errs = measured.errors(k)
                    if fb is not None:
                        seen[point] = measured.three.last_drift[k]
                    done[i] = LazyRow(point, max(errs), (_batch_row, measured, k, (
                        st.name, point, x.shape, x.size, errs, pattern, rs.rules[pattern],
                        pos0, half)))
        for i, row in enumerate(step_rows):
            if isinstance(row, PointResult):          # not traced by one side
                out.append(row)
                continue
            point, key, pattern = row
            rule = rs.rules[pattern]
            row = done.get(i)
            if row is not None and point != TAIL[-1]:
                out.append(row if fold is not None else row.build())
                continue
            va, vb = a[key], b[key]
            try:
                fv, units = floor_at(floor, key, vb, rule, pattern, seen, point, unit_eps)
            except NoFloorError as e:
                raise CompareError(str(e)) from None
            if row is None:
                row = compare_point(st.name, point, va, vb, pattern, rule, rs.rel_floor, pos0,
                                    fv, units)
                point_sums(sysm, point, va, vb, fv)
            else:
                row = row.build()
            if point == TAIL[-1] and va.shape == vb.shape:
                ul = [0.0] * va.shape[0] if units is None else units.tolist()
                res = [compare_logits(st.name, pos0 + j, va[j], vb[j], rule, rs, ul[j])
                       for j in range(va.shape[0])]
                logit_rows += res
                bad = [r for r in res if not r.passed]
                if bad and row.passed:        # only a looser custom rule lets this happen
                    row = _with(row, False, bad[0].pos,
                                f"argmax/top-k/KL check failed at position {bad[0].pos}")
            out.append(row)
        if fold is not None:
            fold.add(si, out)           # while the step's values are still held
        else:
            rows += out
    cmp = Comparison(rows, logit_rows, rs, prefix, a_label or a.label, b_label or b.label,
                     list(b.steps), hidden, floor_label=None if floor is None else floor.label)
    if fold is not None:
        fold.finish(cmp)
    judge_systematic(cmp, sysm, precision, own)
    return cmp


def _batch_row(measured, k, step, point, shape, numel, errs, pattern, rule, pos0, half):
    row = _result(step, point, shape, numel, measured.metrics(k), errs, measured.bad[k],
                  pattern, rule, pos0, half)
    return row if measured.three is None else replace(row, **measured.floor_columns(k))


def _arrays(ladder: Ladder, step: str) -> dict:
    """point -> its values in `step` as a numpy array without a copy (None: not one
    batch.py takes); read from a file, views of the step's bytes."""
    values = ladder.values
    if hasattr(values, "step_arrays"):
        return values.step_arrays(step)
    return {p: as_array(values[f"{step}/{p}"]) for p in ladder.points(step)}


def _with(row: PointResult, passed: bool, first_bad, note: str) -> PointResult:
    return replace(row, passed=passed, first_bad_pos=first_bad, note=note)
