"""Systematic errors below the noise floor: a scale, a bias, a rounding direction, per point
(docs/precision.md, "Systematic errors").

The max-based verdict asks whether the worst element strays further than the floor's worst; at
bfloat16 that bound is several rounding steps wide, and a 1 % wrong scale fits under it. But a
bug repeats: the same direction at every position and step, proportional to the value. Honest
rounding at the declared precision has no direction. So per point, over all its positions:

- the departure from the floor d = a - f (the reference at the declared precision; at float32,
  the reference itself) is fitted as d = bias + scale * x against the reference value x
  (systematic_sums.py: weighted least squares in the position's RMS units);
- the share of moved elements that moved toward zero, the signature of truncation;
- each with a cluster-robust standard error over positions: a position's elements share its
  rounding history (one rounded RMS scalar scales them all), so the position is the unit of
  independent evidence, and the variance comes from the spread between positions. A port that
  rounds more or less often than the floor only widens that spread: it is never flagged for
  being noisier, only for a mean that is not zero;
- for an iterative op (the Sinkhorn plan, `hres`, in its own-op statistics), its pull
  toward the result of one iteration fewer (systematic_sums.direction_sums): 0 for a port
  that iterates as often as the reference, 1 for one an iteration short;
- a Student t test on C - 1 degrees of freedom (C positions), and Holm's step-down over every
  test of the comparison (family-wise error ALPHA under any dependence between points, which
  is the case here: an error at one point is inherited by the next).

Statistical is not material: an estimate significant after correction but inside the
precision's margin (rule_tables.SYSTEMATIC_MARGINS) is a *finding*, printed, exit 0; beyond it,
the point fails like any other and is located. A toward-zero share names the error a rounding
mode only when the shrink it comes with is under one rounding step (a scale further below 1
also moves every element toward zero, and is a scale); such a shrink fails when its estimate
is past TRUNCATION of the margin, the direction test carrying the certainty. The share, not
the shrink, tells chopping from an honest lean: both can shrink by 0.7 to 0.8 u, but chopping
moves nearly every moved element toward zero and honest orders were measured at 0.64 at most
(tools/precision/systematic_false_alarms.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ladder.engine.student import holm, t_sf, two_sided
from ladder.engine.rule_tables import ITERATION_MARGIN
from ladder.engine.systematic_sums import (ALONG, COUNT, GD, GG, MOVED, MOVEDG, NCOLS,
                                           TOWARD, W, WD, WX, WXD, WXX)

ALPHA = 1e-3             # family-wise false-alarm rate of one comparison
MIN_CLUSTERS = 3         # fewer positions give no test (t on 1 degree of freedom is no evidence)
MAX_CLUSTERS = 4096      # past this, neighbouring positions are merged (memory stays bounded)
SETTLE_ROWS = 1 << 15    # rows added before they are sorted by point (~3 MB of sums held)
# A toward-zero share past 0.5 + this, certain, signs truncation. Truncated stores move nearly
# every moved element toward zero (1.0 at `embed`, bfloat16 and float16); honest ports that round
# only where they record were measured leaning 0.61 to 0.64 with a certain share
# (tools/precision/systematic_false_alarms.py, 341 cases: float16 and bfloat16,kv=int8).
TOWARD_MARGIN = 0.25
TRUNCATION = 0.5         # of the scale margin: the shrink with which it fails
# A point's own-op statistics (the port against the reference's op re-run on the port's own
# recorded inputs: ladder/sides/own_error.py) are kept beside its chained ones under this key.
OWN = " (own op)"


def own_key(point: str) -> str:
    return point + OWN


def ladder_point(key: str) -> str:
    """The ladder point a statistics key belongs to (its own-op key included)."""
    return key[:-len(OWN)] if key.endswith(OWN) else key


@dataclass(frozen=True)
class Estimate:
    value: float
    se: float
    p: float                  # before correction
    p_adj: float = math.nan   # Holm-adjusted over the comparison
    margin: float = math.nan

    @property
    def significant(self) -> bool:
        return self.p_adj < ALPHA

    @property
    def material(self) -> bool:
        return self.significant and abs(self.value) > self.margin


@dataclass(frozen=True)
class PointSystematic:
    """One point's systematic statistics over every position compared."""
    point: str
    clusters: int
    elements: int
    scale: Estimate           # value: the slope s (the point reads 1 + s times the truth)
    bias: Estimate            # value: in RMS units of the reference at the point
    toward: Estimate          # value: share of moved elements that moved toward zero
    unit: float = 0.0         # the dtype's spacing at 1.0 (2u): a rounding step, relative
    word: str = "positions"   # what a cluster is (a sweep's pool: merged runs of positions)
    # value: the pull toward one iteration fewer (1: an iteration short); untested (NaN)
    # but for an iterative op's own-op statistics
    iterations: Estimate = Estimate(math.nan, math.nan, math.nan)
    along: float = math.nan   # share of its moved elements that moved to that side

    @property
    def short(self) -> bool:
        """Pulled toward one iteration fewer, certainly, with the signature of it: nearly
        every element that moved, moved that way (an honest port whose records differ from
        the replay for another reason moves them either way, with a pull of any size)."""
        return self.iterations.significant and self.along > 0.5 + TOWARD_MARGIN

    @property
    def own(self) -> bool:
        """Statistics of the point's own op, not of its chained error."""
        return self.point.endswith(OWN)

    @property
    def truncates(self) -> bool:
        """Moved toward zero, certainly and mostly, by less than one rounding step: what
        rounding toward zero does (a scale further below 1 is a scale, not a rounding)."""
        t = self.toward
        return t.significant and t.value > 0.5 + TOWARD_MARGIN \
            and -self.unit < self.scale.value < 0

    @property
    def failed(self) -> bool:
        # An op's own shrink is not failed as a rounding mode: a value recorded too large
        # makes the op reading it look like it shrank (its consumers are recorded honestly)
        shrink = self.truncates and not self.own \
            and self.scale.value < -TRUNCATION * self.scale.margin
        return self.scale.material or self.bias.material or shrink \
            or (self.short and self.iterations.material)

    @property
    def finding(self) -> bool:
        return not self.failed and (self.scale.significant or self.bias.significant
                                    or self.truncates or self.short)

    @property
    def kind(self) -> str:
        if self.truncates:
            return "rounding mode"
        if self.short and (self.iterations.material or not (
                self.scale.material or self.bias.material)):
            return "iteration count"
        sig = [(abs(e.value) / e.margin if e.margin > 0 else math.inf, name)
               for name, e in (("scale", self.scale), ("bias", self.bias)) if e.significant]
        return max(sig)[1] if sig else "scale"

    @property
    def status(self) -> str:
        return "FAIL" if self.failed else "finding" if self.finding else "pass"

    def text(self) -> str:
        """e.g. 'systematic scale at L02.mlp_out: 1.0100 +- 0.0004 (p < 1e-9 after
        correction; margin 0.00049; 18 positions)'."""
        kind = self.kind
        if kind == "bias":
            e, num = self.bias, f"{self.bias.value:+.3g} +- {self.bias.se:.2g} RMS"
        elif kind == "iteration count":
            e = self.iterations
            num = f"{e.value:.3g} +- {e.se:.2g} of one iteration"
        else:
            e, num = self.scale, _scale_text(self.scale)
        if kind == "rounding mode":
            head = (f"rounding mode at {self.point}: {self.toward.value:.0%} of the elements "
                    f"that moved moved toward zero (truncation instead of round-to-nearest, "
                    f"or a shrink under one rounding step), "
                    f"scale {num}")
            p = self.toward.p_adj
        elif kind == "iteration count":
            head = (f"iteration count at {self.point}: the records lean toward the op's "
                    f"result with one iteration fewer, {num}, {self.along:.0%} of the "
                    f"elements that moved moved that way")
            p = e.p_adj
        else:
            head, p = f"systematic {kind} at {self.point}: {num}", e.p_adj
        return (f"{head} ({p_text(p)} after correction; margin {e.margin:.2g}; "
                f"{self.clusters} {self.word})")

    def to_dict(self) -> dict:
        est = lambda e: {"value": _num(e.value), "se": _num(e.se), "p": _num(e.p),
                         "p_adjusted": _num(e.p_adj), "margin": _num(e.margin)}
        return {"point": ladder_point(self.point), "basis": "own op" if self.own else "chained",
                "status": self.status, "kind": self.kind,
                "positions": self.clusters, "elements": self.elements,
                "scale": est(self.scale), "bias": est(self.bias),
                "toward_zero": est(self.toward), "iterations": est(self.iterations),
                "iterations_along": _num(self.along)}


def _num(v):
    return None if v is None or not math.isfinite(v) else float(v)


def p_text(p: float) -> str:
    if math.isnan(p):
        return "no test"
    if p < 1e-9:
        return "p < 1e-9"
    return f"p = {p:.2g}"


class Systematic:
    """Per-position sums of every point of a comparison, added step by step."""

    def __init__(self):
        self._sums: dict = {}                # point -> list of [S, NCOLS] arrays
        self._rows: dict = {}
        self._blocks: list = []              # added, not yet sorted by point
        self._pending = 0                    # their rows

    def add(self, point: str, sums: np.ndarray):
        self.add_rows([point], sums, [0], [sums.shape[0]])

    def add_rows(self, points, sums: np.ndarray, first, counts):
        """Point k's sums are sums[first[k]:first[k] + counts[k]] (a batch's rows, laid end
        to end, first ascending): the same as add() for each. A step adds a row for each of
        ~500 points, so the rows are kept as the batch's block and sorted by point in one
        numpy pass every SETTLE_ROWS rows, not appended one by one."""
        self._blocks.append((points, sums, first, counts))
        self._pending += int(sums.shape[0])
        if self._pending >= SETTLE_ROWS:
            self._settle()

    def _settle(self):
        """The pending blocks' rows appended to their points, in the order they came."""
        blocks, self._blocks, self._pending = self._blocks, [], 0
        if not blocks:
            return
        index: dict = {}
        ids, rows = [], []
        for points, sums, first, counts in blocks:
            k = [index.setdefault(p, len(index)) for p in points]
            counts = np.asarray(counts, np.int64)
            ids.append(np.repeat(np.asarray(k, np.int64), counts))
            first = np.asarray(first, np.int64)
            take = np.repeat(first - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
            rows.append(sums[np.arange(len(take)) + take] if len(take) else sums[:0])
        ids, rows = np.concatenate(ids), np.concatenate(rows)
        order = np.argsort(ids, kind="stable")
        ends = np.cumsum(np.bincount(ids, minlength=len(index)))
        rows = rows[order]
        lo = 0
        for point, hi in zip(index, ends.tolist()):
            parts = self._sums.setdefault(point, [])
            parts.append(rows[lo:hi])
            lo = hi
            n = self._rows[point] = self._rows.get(point, 0) + len(parts[-1])
            if n > MAX_CLUSTERS:
                self._pair(point)

    def _pair(self, point: str):
        """Neighbouring positions merged until at most MAX_CLUSTERS: sums of sums stay valid,
        memory stays bounded."""
        s = np.concatenate(self._sums[point])
        while len(s) > MAX_CLUSTERS:
            if len(s) % 2:
                s = np.concatenate([s, np.zeros((1, NCOLS))])
            s = s[0::2] + s[1::2]
        self._sums[point], self._rows[point] = [s], len(s)

    def points(self) -> list:
        self._settle()
        return list(self._sums)

    def sums(self, point: str) -> np.ndarray:
        self._settle()
        return np.concatenate(self._sums[point])

    def merge(self, other: "Systematic"):
        """Pool another comparison's sums (a sweep's cases of one point)."""
        for point in other.points():
            self.add(point, other.sums(point))

    def finish(self, margins, unit: float = 0.0, word: str = "positions") -> list:
        """PointSystematic per point (insertion order), Holm-corrected over all of them.
        margins(point) -> (scale margin, bias margin); unit: PointSystematic.unit."""
        raw = [(point, *estimates(s), *iterations(s))
               for point, s in ((p, self.sums(p)) for p in self.points())]
        flat = [e.p for _, _, _, sc, bi, tz, it, _ in raw for e in (sc, bi, tz, it)]
        tested = [i for i, p in enumerate(flat) if not math.isnan(p)]
        adj = dict(zip(tested, holm([flat[i] for i in tested])))
        out = []
        for k, (point, c, n, sc, bi, tz, it, along) in enumerate(raw):
            ms, mb = margins(point)
            fix = lambda e, j, m: Estimate(e.value, e.se, e.p, adj.get(4 * k + j, math.nan), m)
            out.append(PointSystematic(point, c, n, fix(sc, 0, ms), fix(bi, 1, mb),
                                       fix(tz, 2, TOWARD_MARGIN), unit, word,
                                       fix(it, 3, ITERATION_MARGIN), along))
        return out


def estimates(s: np.ndarray):
    """(clusters, elements, scale, bias, toward-zero share) of one point's sums [C, NCOLS]."""
    s = s[s[:, COUNT] > 0]
    C, n = len(s), int(s[:, COUNT].sum())
    nan = Estimate(math.nan, math.nan, math.nan)
    if C < MIN_CLUSTERS:
        return C, n, nan, nan, nan
    df = C - 1
    tot = s.sum(0)
    M = np.array([[tot[W], tot[WX]], [tot[WX], tot[WXX]]])
    v = np.array([tot[WD], tot[WXD]])
    det = M[0, 0] * M[1, 1] - M[0, 1] ** 2
    if not det > 1e-12 * M[0, 0] * M[1, 1]:
        scale = bias = nan                   # the reference barely varies: no slope
    else:
        Minv = np.array([[M[1, 1], -M[0, 1]], [-M[0, 1], M[0, 0]]]) / det
        theta = Minv @ v                     # (bias, scale)
        g = np.stack([s[:, WD] - theta[0] * s[:, W] - theta[1] * s[:, WX],
                      s[:, WXD] - theta[0] * s[:, WX] - theta[1] * s[:, WXX]], 1)
        V = Minv @ (g.T @ g * (C / df)) @ Minv
        bias = _test(float(theta[0]), float(V[0, 0]), df)
        scale = _test(float(theta[1]), float(V[1, 1]), df)
    moved = tot[MOVED]
    if moved < 1:
        toward = Estimate(math.nan, math.nan, math.nan)
    else:
        share = tot[TOWARD] / moved
        g = s[:, TOWARD] - share * s[:, MOVED]
        se = math.sqrt(float(g @ g) * C / df) / moved
        t = (share - 0.5) / se if se > 0 else (math.inf if share > 0.5 else 0.0)
        toward = Estimate(float(share), se, t_sf(t, df))
    return C, n, scale, bias, toward


def iterations(s: np.ndarray):
    """(the pull toward one iteration fewer, GD / GG over every position, with its
    cluster-robust error; the share of moved elements that moved that way). NaN (no test)
    for a point without a direction."""
    s = s[s[:, COUNT] > 0]
    C = len(s)
    gg = float(s[:, GG].sum()) if C else 0.0
    moved = float(s[:, MOVEDG].sum()) if C else 0.0
    along = float(s[:, ALONG].sum()) / moved if moved > 0 else math.nan
    if C < MIN_CLUSTERS or not gg > 0:
        return Estimate(math.nan, math.nan, math.nan), along
    k = float(s[:, GD].sum()) / gg
    r = s[:, GD] - k * s[:, GG]
    return _test(k, float(r @ r) * C / (C - 1) / gg ** 2, C - 1), along


def _test(value: float, var: float, df: int) -> Estimate:
    se = math.sqrt(max(var, 0.0))
    if se == 0:
        return Estimate(value, 0.0, 1.0 if value == 0 else 0.0)
    return Estimate(value, se, two_sided(value / se, df))


def _scale_text(e: Estimate) -> str:
    """1 + s with its standard error; below 1e-4 of standard error five digits of 1 + s would
    print '1' for a certain departure, so the departure is written out ('1 + 3.1e-08'), and a
    larger one gets the digits its error resolves ('1.020031 +- 7.2e-05')."""
    if e.se < 1e-4 and e.value == e.value:
        if abs(e.value) < 1e-4:
            return f"1 {'-' if e.value < 0 else '+'} {abs(e.value):.2g} +- {e.se:.2g}"
        digits = min(9, 1 - math.floor(math.log10(e.se))) if e.se > 0 else 6
        return f"{1 + e.value:.{digits}f} +- {e.se:.2g}"
    return f"{1 + e.value:.5g} +- {e.se:.2g}"

