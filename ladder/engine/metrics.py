"""Per-point metrics of two float tensors: max-abs and relative error, ULP distance (on the
integers that order floats), cosine and SQNR. Computed in float64 with numpy; the verdicts that
use them are compare.py's.
"""
from __future__ import annotations

import math

import numpy as np
import torch

def _ordered(x: np.ndarray) -> np.ndarray:
    """Float bits as int64 integers that count ULPs monotonically across zero."""
    i = x.view(np.int64 if x.dtype == np.float64 else np.int32).astype(np.int64)
    mask = 0x7FFFFFFFFFFFFFFF if x.dtype == np.float64 else 0x7FFFFFFF
    return np.where(i < 0, -(i & mask), i)


def _ulps(ca: np.ndarray, cb: np.ndarray) -> float:
    """Largest ULP distance between two same-dtype arrays. Counted in int64: float64 bit
    patterns (~4.6e18) rounded to float64 first would lose every distance under ~1000 ULPs.
    Same-sign pairs subtract exactly; a pair across zero (distance up to 2^64) is the sum of
    the two magnitudes, in float64."""
    if not ca.size:
        return 0.0
    ia, ib = _ordered(ca), _ordered(cb)
    same = (ia >= 0) == (ib >= 0)
    with np.errstate(over="ignore"):
        d = np.where(same, np.abs(np.where(same, ia - ib, 0)).astype(np.float64),
                     np.abs(ia).astype(np.float64) + np.abs(ib).astype(np.float64))
    return float(d.max())


def metrics(a, b, rel_floor: float) -> dict:
    """Every statistic of one point over its [S, ...] values (no pass/fail). numpy: these
    are hundreds of tiny arrays, where torch's per-op overhead dominates."""
    cmp = np.float64 if a.dtype == b.dtype == torch.float64 else np.float32
    an, bn = a.detach().cpu().numpy().reshape(-1), b.detach().cpu().numpy().reshape(-1)
    a64, b64 = an.astype(np.float64), bn.astype(np.float64)
    both = np.isfinite(a64) & np.isfinite(b64)
    out = dict(nan_a=int(np.isnan(a64).sum()), nan_b=int(np.isnan(b64).sum()),
               inf_a=int(np.isinf(a64).sum()), inf_b=int(np.isinf(b64).sum()))
    allfin = bool(both.all())
    x, y = (a64, b64) if allfin else (a64[both], b64[both])
    if not x.size:
        return dict(out, max_abs=0.0, max_rel=0.0, ulp=0.0, cosine=math.nan, sqnr_db=math.nan)
    d = np.abs(x - y)
    ay = np.abs(y)
    ymax = float(ay.max())
    out["max_abs"] = float(d.max())
    out["max_rel"] = float((d / np.maximum(ay, max(rel_floor * ymax, 1e-300))).max())
    ca, cb = an.astype(cmp), bn.astype(cmp)
    if not allfin:
        ca, cb = ca[both], cb[both]
    out["ulp"] = _ulps(ca, cb)
    na, nb = float(np.sqrt(x @ x)), float(np.sqrt(y @ y))
    if na == 0 or nb == 0:
        out["cosine"] = 1.0 if na == nb else 0.0
    else:                   # clamped: rounding can carry a near-parallel pair past 1
        out["cosine"] = min(1.0, max(-1.0, float(x @ y) / (na * nb)))
    sig, noise = float(y @ y), float(d @ d)
    out["sqnr_db"] = math.inf if noise == 0 else (-math.inf if sig == 0
                                                  else 10 * math.log10(sig / noise))
    if not allfin:                 # a statistic over the finite part alone would flatter
        out["cosine"] = out["sqnr_db"] = math.nan
    return out
