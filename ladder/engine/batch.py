"""Every point of one step measured in a few passes over the step's values laid end to end.

A long comparison is ~10^5 points of a few thousand floats each: computed point by point
(metrics.py, Rule.position_errors) the per-call overhead of numpy and torch is ~1 ms a point,
far more than the arithmetic. Here the values of a step's points are concatenated once and
every statistic is a segmented reduction (`ufunc.reduceat`) over the whole step.

The results must equal the per-point path bit for bit, so only reductions whose value does not
depend on the order of summation are segmented (max, counts); the three dot products behind
cosine and SQNR are the same BLAS calls on the same contiguous float64 slices as metrics.py
makes. A rule error per position, max_i(d_i / c) with c the position's allowance, is taken as
max_i(d_i) / c: IEEE division by a positive constant is monotonic, so the two are equal.

Points this path does not cover (mixed or 16-bit dtypes, exact or p99 or elementwise rules,
empty shapes, a NaN/Inf anywhere in the point) come back as None: the caller measures them
point by point, which is what decides those cases.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ladder.engine import scratch
from ladder.engine.systematic_sums import segmented_sums
from ladder.engine.three_way import batch_units

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def batchable(rule) -> bool:
    """Whether points under `rule` can be measured in the step's batch."""
    return not rule.exact and rule.stat == "max" and rule.scale == "maxabs"


def as_array(t):
    """A tensor's values as a numpy array without a copy, or None where the batch cannot
    take it (a 16-bit or integer dtype, a device, a graph)."""
    if t.device.type != "cpu" or t.requires_grad or t.dtype not in (torch.float32,
                                                                    torch.float64):
        return None
    return t.numpy()


def eligible(x, y) -> bool:
    """Whether this pair of arrays (as_array) can be measured in the step's batch."""
    return (x is not None and y is not None and x.dtype == y.dtype and x.dtype in _FLOATS
            and x.shape == y.shape and x.ndim >= 1 and x.size > 0)


_HALF = (torch.bfloat16, torch.float16)


def pair(a, b, key: str, x, y):
    """The batch's arrays of one point, and compare_point's `half` note: a 16-bit side is
    widened to float32 (exactly, as compare_point does) when the other is float32 too."""
    if x is not None and y is not None:
        return x, y, ()
    ta = a[key] if x is None else None
    tb = b[key] if y is None else None
    dt = [t.dtype for t in (ta, tb) if t is not None]
    if not all(d in _HALF for d in dt) or (x is not None and x.dtype != np.float32) \
            or (y is not None and y.dtype != np.float32):
        return x, y, ()
    half = tuple(f"{side} is {str(t.dtype)[6:]}" for side, t in (("a", ta), ("b", tb))
                 if t is not None)
    return (x if ta is None else as_array(ta.float()),
            y if tb is None else as_array(tb.float()), half)


def floor_array(floor, key: str, in_f: dict, point: str, y):
    """The noise floor's values at the point as a float32/float64 array of y's shape, or
    None (the per-point path then decides: a missing floor, a shape of its own)."""
    if point not in in_f or y is None:
        return None
    f = in_f[point]
    if f is None:
        t = floor[key]
        if t.dtype not in _HALF:
            return None
        f = as_array(t.float())
    return f if f is not None and f.shape == y.shape else None


def _ordered(bits: np.ndarray) -> np.ndarray:
    """float64 bits as int64 integers that count ULPs monotonically across zero (metrics.py):
    a negative pattern i maps to -(i & mask)."""
    i = bits.astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFFFFFFFFFF), i)


def _ulp_max(A: np.ndarray, B: np.ndarray, starts: np.ndarray) -> list:
    """Each point's largest ULP distance (metrics._ulps), points laid end to end from
    `starts`. For float32, on the raw bit patterns ia, ib (int32): where the signs agree
    the ordered patterns differ by |ia - ib| (for two negatives both are mirrored), where
    they differ the distance is the two magnitudes' sum, (ia & m) + (ib & m), m = 2^31 - 1;
    both are taken in int64, exactly (< 2^32). Pairs across zero are few: they are fixed up
    after one subtraction over all."""
    if A.dtype == np.float32:
        n = A.size
        ia, ib = A.view(np.int32), B.view(np.int32)
        d = np.subtract(ia, ib, out=scratch.take("ulp.d", n, np.int64), dtype=np.int64)
        across = np.bitwise_xor(ia, ib, out=scratch.take("ulp.x", n, np.int32))
        across = np.less(across, 0, out=scratch.take("ulp.across", n, bool))
        if across.any():
            k = np.flatnonzero(across)
            d[k] = (ia[k] & 0x7FFFFFFF).astype(np.int64) + (ib[k] & 0x7FFFFFFF)
        top = np.maximum(np.maximum.reduceat(d, starts), -np.minimum.reduceat(d, starts))
        return top.astype(np.float64).tolist()
    ia, ib = _ordered(A.view(np.int64)), _ordered(B.view(np.int64))
    same = (ia >= 0) == (ib >= 0)
    with np.errstate(over="ignore"):
        d = np.where(same, np.abs(np.where(same, ia - ib, 0)).astype(np.float64),
                     np.abs(ia).astype(np.float64) + np.abs(ib).astype(np.float64))
    return np.maximum.reduceat(d, starts).tolist()


# Elements a measure call takes at most: its float64 temporaries (~8 arrays of this length)
# stay ~16 MB whatever the step's size, as a streamed comparison's memory must
CHUNK = 1 << 18


def chunks(sizes: list, limit: int | None = None):
    """(first, end) index ranges of consecutive points, each of at most `limit` (CHUNK)
    elements (a point larger than that on its own)."""
    limit = CHUNK if limit is None else limit
    lo, total = 0, 0
    for i, n in enumerate(sizes):
        if total and total + n > limit:
            yield lo, i
            lo, total = i, 0
        total += n
    if lo < len(sizes):
        yield lo, len(sizes)


def measure(pairs: list, rules: list, rel_floor: float, floors=None) -> list:
    """pairs: [(x, y)] numpy arrays of one dtype, each pair `eligible`, its rule in `rules`
    `batchable`. Returns (the indices of the pairs measured, their Measured in that order):
    a pair holding a NaN/Inf is left out, for the caller to measure point by point.

    floors: three-way (three_way.py), a FloorBatch: each pair's noise-floor values (a float32
    or float64 array of its shape) and the floor's running drift before this step; the rule
    errors then allow each rule's `noise` x the noise unit, and Measured carries the floor's
    columns. A pair whose floor holds a NaN/Inf is left out too."""
    if not pairs:
        return [], None
    sizes = np.fromiter((x.size for x, _ in pairs), np.int64, len(pairs))
    S = np.fromiter((x.shape[0] for x, _ in pairs), np.int64, len(pairs))
    # the chunk's element-sized arrays are scratch.py's work arrays: allocated once, not per chunk
    n, dt = int(sizes.sum()), pairs[0][0].dtype
    A = scratch.concatenate("A", [x.reshape(-1) for x, _ in pairs], dt)
    B = scratch.concatenate("B", [y.reshape(-1) for _, y in pairs], dt)
    F = None
    if floors is not None:
        parts = [f.reshape(-1) for f in floors.values]
        F = scratch.concatenate("F", parts, np.result_type(*parts))
    starts = np.zeros(len(pairs), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    wide = A.dtype == np.float64
    if wide:
        A64, B64 = A, B
    else:
        A64, B64 = scratch.take("A64", n), scratch.take("B64", n)
        np.copyto(A64, A)
        np.copyto(B64, B)
    with np.errstate(invalid="ignore", over="ignore"):
        signed = np.subtract(A64, B64, out=scratch.take("signed", n))    # a - b
    D = np.abs(signed, out=scratch.take("D", n))
    # position j of point i starts at starts[i] + j * width_i
    width = sizes // S
    pos_first = np.zeros(len(pairs), dtype=np.int64)        # index of a point's position 0
    np.cumsum(S[:-1], out=pos_first[1:])
    within = np.arange(int(S.sum()), dtype=np.int64) - np.repeat(pos_first, S)
    pos_starts = np.repeat(starts, S) + within * np.repeat(width, S)
    pos_d = np.maximum.reduceat(D, pos_starts)
    # a NaN or Inf in a or b reaches |a - b| and its maximum (a - b of finite float32 values
    # cannot overflow; of float64 ones it can, and that point is measured one by one, which
    # gives the same row); the floor is checked itself
    point_d = np.maximum.reduceat(pos_d, pos_first)
    ok = np.isfinite(point_d)
    if F is not None and not np.isfinite(F).all():
        ok &= np.logical_and.reduceat(np.isfinite(F), starts)
    if not ok.all():
        keep = [i for i in range(len(pairs)) if ok[i]]
        return keep, measure([pairs[i] for i in keep], [rules[i] for i in keep], rel_floor,
                             None if floors is None else floors.subset(keep))[1]
    AB = np.abs(B64, out=scratch.take("AB", n))
    pos_b = np.maximum.reduceat(AB, pos_starts)
    max_abs = point_d.tolist()
    ymax = np.maximum.reduceat(pos_b, pos_first)
    floor = np.maximum(rel_floor * ymax, 1e-300)
    rel = np.repeat(floor, sizes)    # fresh, but its block is reused: the rest are held
    np.maximum(AB, rel, out=rel)
    np.divide(D, rel, out=rel)
    max_rel = np.maximum.reduceat(rel, starts).tolist()
    ulp = _ulp_max(A, B, starts)
    # Rule.allowance and position_ratios' division, position by position, as float64 arrays:
    # the same IEEE operations in the same order as the scalar and torch forms
    rt = np.repeat(np.fromiter((r.rtol for r in rules), np.float64, len(rules)), S)
    at = np.repeat(np.fromiter((r.atol for r in rules), np.float64, len(rules)), S)
    fl = np.repeat(np.fromiter((r.floor for r in rules), np.float64, len(rules)), S)
    allow = np.maximum(at + rt * pos_b, fl)
    three = None
    if floors is not None:
        three = batch_units(F, B64, pos_starts, pos_first, S, pos_b, pos_d, floors)
        noise = np.repeat(np.fromiter((r.noise for r in rules), np.float64, len(rules)), S)
        allow = np.where(noise > 0, np.maximum(allow, noise * three.units), allow)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        err = np.where(allow > 0, pos_d / np.maximum(allow, 1e-300),
                       np.where(pos_d == 0, 0.0, np.inf))
    # the systematic tests' per-position sums (systematic_sums.py): a - floor, or a - b at
    # float32, against b
    sums = segmented_sums(A64, B64, B64 if F is None else F, pos_starts, np.repeat(width, S),
                          d=signed if F is None else None,
                          narrow=not wide and (F is None or F.dtype == np.float32))
    bad = np.zeros(len(pairs), dtype=np.int64)
    owner = np.repeat(np.arange(len(pairs)), S)
    for k in np.flatnonzero(err > 1).tolist():   # only a failing position has elements over
        i, c = int(owner[k]), float(allow[k])
        lo = int(pos_starts[k])
        dj = D[lo:lo + int(width[i])]
        bad[i] += int((dj / max(c, 1e-300) > 1).sum()) if c > 0 else int((dj != 0).sum())
    return list(range(len(pairs))), Measured(pairs, S.tolist(), pos_first.tolist(), max_abs,
                                             max_rel, ulp, err.tolist(), bad.tolist(), three,
                                             sums)


class Measured:
    """The batch's results for a step, per point i. The cosine and SQNR (four dot products
    a point) are computed when asked for: a streamed comparison keeps a few rows a point,
    and asks them of those alone."""

    def __init__(self, pairs, S, pos_first, max_abs, max_rel, ulp, err, bad, three=None,
                 sums=None):
        # the pairs themselves (views of the step's values), not the batch's float64
        # copies: a kept row widens its own values again, so the batch's memory is freed
        # when measure returns
        self._pairs, self._S, self._p0 = pairs, S, pos_first
        self._max_abs, self._max_rel, self._ulp = max_abs, max_rel, ulp
        self._err, self.bad = err, bad
        self.three = three              # three_way.BatchFloor, or None
        self._sums = sums               # [positions, NCOLS]: systematic_sums' columns

    def add_systematic(self, sysm, points: list):
        """Every point's systematic sums into `sysm` (systematic.Systematic), point i as
        points[i]."""
        sysm.add_rows(points, self._sums, self._p0, self._S)

    def floor_columns(self, i: int) -> dict:
        """The three-way columns of point i's row (three_way.three_way's)."""
        p0, t = self._p0[i], self.three
        return dict(floor_abs=t.floor_abs[i], noise_ratio=t.ratio[i],
                    units=tuple(t.unit_list[p0:p0 + self._S[i]]))

    def __len__(self):
        return len(self._pairs)

    def errors(self, i: int) -> list:
        """Rule.position_errors of point i."""
        p0 = self._p0[i]
        return self._err[p0:p0 + self._S[i]]

    def metrics(self, i: int) -> dict:
        """metrics.metrics of point i."""
        a, b = self._pairs[i]
        # the BLAS call metrics.py's `@` makes, on the same 1-D float64 values
        x, y, dot = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64), np.dot
        d = np.subtract(x, y)
        np.abs(d, out=d)
        xx, yy = float(dot(x, x)), float(dot(y, y))
        na, nb = math.sqrt(xx), math.sqrt(yy)
        if na == 0 or nb == 0:
            cosine = 1.0 if na == nb else 0.0
        else:               # clamped: rounding can carry a near-parallel pair past 1
            cosine = min(1.0, max(-1.0, float(dot(x, y)) / (na * nb)))
        noise = float(dot(d, d))
        sqnr = math.inf if noise == 0 else (-math.inf if yy == 0
                                            else 10 * math.log10(yy / noise))
        return dict(nan_a=0, nan_b=0, inf_a=0, inf_b=0, max_abs=self._max_abs[i],
                    max_rel=self._max_rel[i], ulp=self._ulp[i], cosine=cosine, sqnr_db=sqnr)
