"""Per-position sums behind the systematic-error tests (systematic.py), from a point's values.

For each position (a cluster: its elements share the position's rounding history, so they are
not independent draws) the candidate's departure from the noise floor, d = a - f, is fitted
against the reference value x = b as d = beta + s * x by weighted least squares. Both are made
dimensionless by the position's RMS of x (so the bias is in RMS units and positions of any
magnitude weigh alike), and each element is weighted 1 / (x^2 + TAU^2): rounding noise grows
with |x|, so this gives every element of ordinary size about equal say in the scale (the
plain least-squares slope is ruled by a few outlier lanes), while elements near zero, whose
ratio d / x is all noise, are damped.

The last four columns hold an iterative op's pull toward its one-iteration-short result
(direction_sums; zero for every other point).

The columns are the sufficient statistics of that fit and of the rounding-direction count;
the fit and its cluster-robust variance need nothing else, so a point's sums over many steps
are simply added (systematic.Systematic), and the batched pass computes them with segmented
sums over a whole step (batch.py).
"""
from __future__ import annotations

import numpy as np

TAU = 0.25               # in RMS units of the position
# columns of a cluster's row
W, WX, WXX, WD, WXD, TOWARD, MOVED, COUNT, GG, GD, ALONG, MOVEDG = range(12)
NCOLS = 12
DIRECTION = [GG, GD, ALONG, MOVEDG]      # direction_sums' columns, in its order


def position_sums(a: np.ndarray, b: np.ndarray, f: np.ndarray) -> np.ndarray:
    """[S, NCOLS] float64 sums of a point's positions; a, b, f: [S, ...] (any float dtype).
    The batch's own function on a batch of one point: the same sums, bit for bit."""
    S = a.shape[0]
    width = a.size // S if S else 0
    if not width:
        return np.zeros((S, NCOLS))
    flat = lambda v: np.asarray(v, np.float64).reshape(-1)
    starts = np.arange(S, dtype=np.int64) * width
    return segmented_sums(flat(a), flat(b), flat(f), starts, np.full(S, width, np.int64))


def segmented_sums(A64: np.ndarray, B64: np.ndarray, F: np.ndarray, pos_starts: np.ndarray,
                   pos_width: np.ndarray) -> np.ndarray:
    """position_sums for every position of a batch laid end to end (batch.measure's layout):
    [positions, NCOLS]. pos_starts: each position's first element; pos_width: its length."""
    x = B64
    d = np.subtract(F.astype(np.float64, copy=False), A64)
    np.negative(d, out=d)                                  # d = a - f
    ms = np.add.reduceat(x * x, pos_starts) / np.maximum(pos_width, 1)
    rms = np.sqrt(ms)
    ok = rms > 0
    inv = np.repeat(np.where(ok, 1.0 / np.where(ok, rms, 1.0), 0.0), pos_width)
    xs, ds = x * inv, d * inv
    w = 1.0 / (xs * xs + TAU * TAU)
    w *= np.repeat(ok, pos_width)
    out = np.zeros((len(pos_starts), NCOLS))
    wx = w * xs
    red = np.add.reduceat
    out[:, W] = red(w, pos_starts)
    out[:, WX] = red(wx, pos_starts)
    out[:, WXX] = red(wx * xs, pos_starts)
    out[:, WD] = red(w * ds, pos_starts)
    out[:, WXD] = red(wx * ds, pos_starts)
    moved = (d != 0) & (x != 0)
    out[:, TOWARD] = red(((d * x) < 0) & moved, pos_starts)
    out[:, MOVED] = red(moved, pos_starts)
    out[:, COUNT] = np.where(ok, pos_width, 0)
    return out


def direction_sums(a: np.ndarray, stored: np.ndarray, g: np.ndarray) -> np.ndarray:
    """[S, 4] float64 (GG, GD, ALONG, MOVEDG) of one point: how far the port's records `a` [S, ...] lean
    along `g`, the change one iteration fewer makes to the replayed op, from `stored`, the
    replay as the record stores it (rounded to the declared dtype).

    Against the stored replay, a port that computes the op exactly from its recorded inputs
    departs nowhere (our bfloat16 port: not one element of hres), and one an iteration short
    departs where its result crosses a rounding boundary, on g's side: the mean of a rounding
    over where a value falls in its step is the value. Both d = a - stored and g are centred
    per element over the S positions first: a pattern that repeats at every position (a
    plan that barely varies with the token rounds the same way every time) is one piece of
    evidence, not S, and is removed rather than counted S times. What remains is whether the
    records move with g where g moves.

    ALONG / MOVEDG is the signature beside that pull: of the elements where g is nonzero and
    the record differs from the stored replay, the share that moved to g's side. An op an
    iteration short moves them all that way (only g moved them); an honest port whose records
    differ for another reason (it read its inputs unrounded) moves them either way."""
    S = a.shape[0]
    out = np.zeros((S, 4))
    if S < 2:
        return out
    d = np.asarray(a, np.float64).reshape(S, -1) - np.asarray(stored, np.float64).reshape(S, -1)
    g = np.asarray(g, np.float64).reshape(S, -1)
    moved = (d != 0) & (g != 0)
    out[:, 2] = (moved & ((d > 0) == (g > 0))).sum(1)
    out[:, 3] = moved.sum(1)
    d, g = _centred(d), _centred(g)
    out[:, 0] = (g * g).sum(1)
    out[:, 1] = (g * d).sum(1)
    return out


def _centred(v: np.ndarray) -> np.ndarray:
    """v [S, n] less its mean over positions, per element; what is left of a value repeated
    at every position is the mean's own rounding, and is zero here."""
    c = v - v.mean(0)
    c[np.abs(c) <= 1e-9 * np.abs(v).max(0)] = 0.0
    return c
