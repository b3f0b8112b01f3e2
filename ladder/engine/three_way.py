"""Three-way rows: a candidate, the float32 reference and a noise floor (the reference at the
candidate's precision, docs/precision.md). The noise unit at each position comes from the
floor's running drift (rule.py `noise_units`); compare.py calls these for every row that has
a floor beside it, on the per-point path.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch

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
