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

from ladder.engine import scratch

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
                   pos_width: np.ndarray, d: np.ndarray | None = None,
                   narrow: bool = False) -> np.ndarray:
    """position_sums for every position of a batch laid end to end (batch.measure's layout):
    [positions, NCOLS]. pos_starts: each position's first element; pos_width: its length;
    d: a - f when the caller has it already (float64); narrow: a, b and f are all float32
    values (below). The element-sized temporaries are scratch.py's work arrays; the result is
    the caller's own.

    Every column is a sum over a position, so each of its constant factors is applied to the
    position's sum rather than to each element: with c = 1 / rms, xs = c x and ds = c d,
    sum w xs = c sum w x, sum w ds = c sum w d, sum w xs ds = c^2 sum w x d, and
    sum w xs^2 = width - tau^2 sum w, since w xs^2 = 1 - tau^2 w. Only w itself needs c at
    each element. These are a comparison's largest cost after reading the values (each pass
    over a chunk's elements is one numpy call), so they take as few passes as the sums allow.

    The moved and toward-zero counts are read off w x d, which has the sign of d x (w > 0):
    for float32 values a nonzero d and x are each at least 2^-149, w at least 1 / (width +
    tau^2), so the product cannot underflow to zero; for wider values it could, and the
    counts are taken from d and x themselves."""
    n, x = B64.size, B64
    if d is None:
        d = np.subtract(A64, F, out=scratch.take("sys.d", n))     # F widened exactly
    red = np.add.reduceat
    x2 = np.multiply(x, x, out=scratch.take("sys.w", n))
    ms = red(x2, pos_starts) / np.maximum(pos_width, 1)
    ok = ms > 0
    c2 = np.where(ok, 1.0 / np.where(ok, ms, 1.0), 0.0)          # 1 / rms^2, 0 where all zero
    c = np.sqrt(c2)
    w = np.multiply(x2, np.repeat(c2, pos_width), out=x2)           # xs^2
    w += TAU * TAU
    np.divide(1.0, w, out=w)
    if not ok.all():                 # a position of zeros weighs nothing
        for s, k in zip(pos_starts[~ok].tolist(), pos_width[~ok].tolist()):
            w[s:s + k] = 0.0
    out = np.zeros((len(pos_starts), NCOLS))
    wx = np.multiply(w, x, out=scratch.take("sys.wx", n))
    t = scratch.take("sys.t", n)
    out[:, W] = red(w, pos_starts)
    out[:, WX] = red(wx, pos_starts) * c
    out[:, WXX] = np.where(ok, pos_width - TAU * TAU * out[:, W], 0.0)
    out[:, WD] = red(np.multiply(w, d, out=t), pos_starts) * c
    wxd = np.multiply(wx, d, out=t)
    out[:, WXD] = red(wxd, pos_starts) * c2
    flag = scratch.take("sys.flag", n, bool)
    u8 = flag.view(np.uint8)
    if narrow:
        out[:, TOWARD] = red(np.less(wxd, 0.0, out=flag).view(np.uint8), pos_starts,
                             dtype=np.int64)
        out[:, MOVED] = red(np.not_equal(wxd, 0.0, out=flag).view(np.uint8), pos_starts,
                            dtype=np.int64)
    else:
        out[:, TOWARD] = red(np.less(np.multiply(d, x, out=t), 0.0, out=flag).view(np.uint8),
                             pos_starts, dtype=np.int64)
        moved = np.not_equal(d, 0.0, out=flag)
        moved &= np.not_equal(x, 0.0, out=scratch.take("sys.flag2", n, bool))
        out[:, MOVED] = red(u8, pos_starts, dtype=np.int64)
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
