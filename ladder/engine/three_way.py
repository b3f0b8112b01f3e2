"""Three-way rows: a candidate, the float32 reference and a noise floor (the reference at the
candidate's precision, docs/precision.md). The noise unit at each position comes from the
floor's running drift (rule.py `noise_units`). compare.py measures a row with a floor
beside it in the step's batch where batch.py takes the point (FloorBatch, batch_units), and
point by point otherwise (floor_at, three_way): the logits, a NaN/Inf in any of the three, a
point the floor lacks.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from ladder.engine import scratch
from ladder.engine.rule import by_position, noise_units


class NoFloorError(ValueError):
    """A noise-unit rule met a point the noise floor does not hold."""


def three_way(row, a, b, floor, units):
    """`row` with the noise floor's error and the candidate's in noise units."""
    d = by_position((a.double() - b.double()).abs())
    port = d.amax(1) if d.shape[1] else d.new_zeros(d.shape[0])
    fd = by_position((floor.double() - b.double()).abs())
    r = torch.where(units > 0, port / units.clamp_min(1e-300),
                    torch.where(port == 0, 0.0, math.inf))
    ratio = float(r.max()) if r.numel() else 0.0
    if math.isnan(ratio) or nonfinite_a(a):
        ratio = math.inf                              # a NaN/Inf capture: unbounded
    note = row.note
    if not bool(torch.isfinite(floor).all()):
        note = "; ".join(n for n in (note, "the noise floor overflowed here (NaN/Inf): its "
                                           "unit counts its finite values only") if n)
    return replace(row, floor_abs=float(fd.max()) if fd.numel() else 0.0, noise_ratio=ratio,
                   units=tuple(units.tolist()), note=note)


def nonfinite_a(a) -> bool:
    return a.is_floating_point() and not bool(torch.isfinite(a).all())


def floor_at(floor, key, vb, rule, pattern, seen, point, unit_eps):
    """(the floor's values at `key`, the noise unit per position) or (None, None); updates
    `seen`, the floor's running drift at the point."""
    fv = floor[key] if floor is not None and key in floor else None
    if fv is not None and tuple(fv.shape) != tuple(vb.shape):
        fv = None                       # the floor cannot judge a point of another shape
    if fv is None:
        if rule.noise:
            raise NoFloorError(f"{key}: rule {pattern!r} ({rule.describe()}) is in noise "
                               f"units, and no noise floor holds the point (declare the "
                               f"candidate's precision, or use absolute rules)")
        return None, None
    drift = noise_units(fv, vb, 0.0, seen.get(point, 0.0))
    if drift.numel():
        seen[point] = float(drift[-1])
    return fv, torch.maximum(drift, noise_units(fv, vb, unit_eps))


class FloorBatch:
    """The noise floor beside one batch of points (batch.measure): per point, the floor's
    values (float32 or float64 numpy, the point's shape) and its running drift before this
    step (`seen`); `unit_eps` as in floor_at."""

    def __init__(self, values: list, priors: list, unit_eps: float):
        self.values, self.priors, self.unit_eps = values, priors, unit_eps

    def subset(self, keep: list) -> "FloorBatch":
        return FloorBatch([self.values[i] for i in keep], [self.priors[i] for i in keep],
                          self.unit_eps)


class BatchFloor:
    """batch_units' answer: per position the noise unit (`units`, and as a list); per point
    the floor's max|floor-b|, the candidate's largest ratio to the unit, and the drift at
    its last position (the next step's prior)."""

    def __init__(self, units, floor_abs, ratio, last_drift):
        self.units, self.unit_list = units, units.tolist()
        self.floor_abs, self.ratio, self.last_drift = floor_abs, ratio, last_drift


def batch_units(F, B64, pos_starts, pos_first, S, pos_b, pos_d, floors: FloorBatch):
    """floor_at's units and three_way's columns for every point of a batch at once, with
    the same float64 operations: maxima are exact whatever their order, so the segmented
    forms equal the per-point ones bit for bit (tests/ladder/engine/test_batch.py holds them so).
    F: the floors laid end to end as B64 is (finite: batch.measure sends the rest back);
    pos_starts, pos_first, S, pos_b, pos_d: batch.measure's per-position layout."""
    FD = np.subtract(F, B64, out=scratch.take("three.fd", B64.size))   # F widened exactly
    np.abs(FD, out=FD)
    pos_fd = np.maximum.reduceat(FD, pos_starts)
    drift = np.maximum(pos_fd, np.repeat(np.asarray(floors.priors, np.float64), S))
    for i in np.flatnonzero(S > 1).tolist():         # the running max along each point
        lo = int(pos_first[i])
        np.maximum.accumulate(drift[lo:lo + int(S[i])], out=drift[lo:lo + int(S[i])])
    units = np.maximum(drift, floors.unit_eps * pos_b)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(units > 0, pos_d / np.maximum(units, 1e-300),
                     np.where(pos_d == 0, 0.0, np.inf))
    last = pos_first + S - 1
    return BatchFloor(units, np.maximum.reduceat(pos_fd, pos_first).tolist(),
                      np.maximum.reduceat(r, pos_first).tolist(), drift[last].tolist())
