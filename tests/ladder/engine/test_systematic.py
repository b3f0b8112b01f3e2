"""The systematic-error statistics (ladder/engine/systematic.py) on synthetic points whose
truth is known: an honest bfloat16 side (round-to-nearest, and a per-position common scale
noise as a rounded RMS scalar gives a real port), the same with a planted scale, a bias, and
truncation instead of rounding; margins and Holm as the verdict uses them."""
import math

import numpy as np
import pytest
import torch

from ladder.engine.systematic import MAX_CLUSTERS, Systematic, estimates
from ladder.engine.systematic_sums import NCOLS, position_sums, segmented_sums

U = 2.0 ** -8                 # bfloat16's unit roundoff
MARGINS = lambda point: (U / 8, U / 8)


def rne(x):
    return torch.from_numpy(x).float().to(torch.bfloat16).double().numpy()


def truncate(x):
    bits = torch.from_numpy(x).float().view(torch.int32) & ~0xFFFF
    return bits.view(torch.float32).double().numpy()


def side(rng, x, scale=0.0, bias=0.0, rounding=rne, jitter=2e-3):
    """x [C, n] computed at bfloat16 by a side with its own rounding history: each position
    scaled by its own 1 + N(0, jitter) (one shared rounded scalar), elements jittered by
    about half a rounding, then the planted error, then stored."""
    C = x.shape[0]
    common = 1 + jitter * rng.standard_normal((C, 1))
    v = x * common * (1 + U * 0.5 * rng.standard_normal(x.shape))
    return rounding(v * (1 + scale) + bias * np.sqrt(np.mean(x * x, 1, keepdims=True)))


def point(seed, C=40, n=256, **planted):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((C, n)) * np.exp(rng.standard_normal(n))   # outlier lanes
    b = x.astype(np.float32).astype(np.float64)
    return side(rng, x, **planted), b, side(rng, x)


def judged(*points):
    s = Systematic()
    for i, (a, b, f) in enumerate(points):
        s.add(f"p{i}", position_sums(a, b, f))
    return s.finish(MARGINS, 2 * U)


def test_honest_sides_raise_no_alarm_over_many_seeds():
    """120 honest points in 40 comparisons of 3: no failure and no finding (the tests' null
    holds: an honest side's departure from the floor has no direction)."""
    alarms = [r for seed in range(40)
              for r in judged(*(point(100 * seed + k) for k in range(3)))
              if r.failed or r.finding]
    assert alarms == []


def test_a_noisier_honest_side_is_not_flagged():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((40, 256))
    b = x.astype(np.float32).astype(np.float64)
    noisy = rne(side(rng, x, jitter=8e-3) * (1 + U * rng.standard_normal(x.shape)))
    [r] = judged((noisy, b, side(rng, x)))
    assert not (r.failed or r.finding), r.text()


@pytest.mark.parametrize("scale", [0.01, 0.003])
def test_a_planted_scale_is_estimated_and_fails(scale):
    [r] = judged(point(3, scale=scale))
    assert r.failed and r.kind == "scale", r.text()
    assert abs(r.scale.value - scale) < 4 * r.scale.se
    assert r.scale.p_adj < 1e-3 and "systematic scale at p0" in r.text()


def test_a_scale_inside_the_margin_is_a_finding_not_a_failure():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((400, 256))
    b = x.astype(np.float32).astype(np.float64)
    a = x * (1 + U / 16) * (1 + 1e-4 * rng.standard_normal(x.shape))   # float32-like noise
    [r] = judged((a, b, b))
    assert r.finding and not r.failed and r.status == "finding", r.text()


def test_a_planted_bias_fails_as_a_bias():
    [r] = judged(point(4, bias=0.004))
    assert r.failed and r.kind == "bias", r.text()
    assert abs(r.bias.value - 0.004) < 4 * r.bias.se


def test_truncation_is_named_a_rounding_mode():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((40, 256))
    b = x.astype(np.float32).astype(np.float64)
    a = side(rng, x, rounding=truncate, jitter=0.0)
    [r] = judged((a, b, side(rng, x, jitter=0.0)))
    assert r.failed and r.kind == "rounding mode", r.text()
    assert r.toward.value > 0.7 and "toward zero" in r.text()


def test_a_plain_scale_below_one_is_a_scale_not_a_rounding():
    [r] = judged(point(8, scale=-0.05))
    assert r.failed and r.kind == "scale", r.text()


def test_few_positions_give_no_test_and_no_verdict():
    a, b, f = point(9, C=2, scale=0.5)
    [r] = judged((a, b, f))
    assert math.isnan(r.scale.p) and not r.failed and not r.finding


def test_the_batch_sums_equal_a_points_own_bit_for_bit():
    p, q = point(10, C=5, n=33), point(11, C=3, n=17)
    flat = lambda k: np.concatenate([p[k].reshape(-1), q[k].reshape(-1)])
    starts = np.array([0, 33, 66, 99, 132, 165, 182, 199], np.int64)
    widths = np.array([33] * 5 + [17] * 3, np.int64)
    both = segmented_sums(flat(0), flat(1), flat(2), starts, widths)
    assert np.array_equal(both[:5], position_sums(*p))
    assert np.array_equal(both[5:], position_sums(*q))


def test_merging_positions_past_the_cap_keeps_the_estimate():
    a, b, f = point(12, C=MAX_CLUSTERS + 100, n=16, scale=0.01)
    s = Systematic()
    s.add("p", position_sums(a, b, f))
    assert len(s.sums("p")) <= MAX_CLUSTERS
    _, _, merged, _, _ = estimates(s.sums("p"))
    _, _, whole, _, _ = estimates(position_sums(a, b, f))
    assert merged.value == pytest.approx(whole.value, rel=1e-12)
    assert abs(merged.se - whole.se) < 0.2 * whole.se


def test_holm_covers_every_point_of_the_comparison():
    """The same planted point among more honest ones gets a larger adjusted p."""
    bad = point(13, scale=0.006)
    alone = judged(bad)[0].scale.p_adj
    crowd = judged(bad, *(point(200 + k) for k in range(20)))[0].scale.p_adj
    assert crowd > alone


def test_a_shrink_under_one_rounding_step_is_named_as_possibly_either():
    """At bfloat16 a 0.997 scale and truncation both move ~every element toward zero by
    under a rounding step: the statistics cannot tell them apart, and the text says so."""
    [r] = judged(point(3, scale=-0.003))
    assert r.failed and r.kind == "rounding mode"
    assert "or a shrink under one rounding step" in r.text()


def test_a_tiny_certain_scale_prints_its_departure():
    # At float32 a finding of 1 + 3.1e-8 +- 6.7e-9 printed five digits of 1 + s: "1 +- 6.7e-09"
    from ladder.engine.systematic import Estimate, _scale_text
    assert _scale_text(Estimate(3.1e-8, 6.7e-9, 1e-6)) == "1 + 3.1e-08 +- 6.7e-09"
    assert _scale_text(Estimate(-2.5e-6, 4e-7, 1e-6)) == "1 - 2.5e-06 +- 4e-07"
    assert _scale_text(Estimate(0.0033, 0.00036, 1e-6)) == "1.0033 +- 0.00036"


@pytest.mark.parametrize("settle", [1, 7, 1 << 15])
def test_rows_added_in_blocks_reach_their_points_in_arrival_order(monkeypatch, settle):
    """add_rows keeps a batch's block and sorts it by point later (every SETTLE_ROWS rows):
    each point must get exactly its rows, in the order they came, whenever the sort runs."""
    from ladder.engine import systematic
    monkeypatch.setattr(systematic, "SETTLE_ROWS", settle)
    rng = np.random.default_rng(5)
    s, want = Systematic(), {}
    for step in range(9):
        names = [f"p{k}" for k in rng.permutation(6)[:4 + step % 3]]
        counts = rng.integers(0 if step else 1, 4, len(names))
        block = rng.standard_normal((int(counts.sum()), NCOLS))
        first = np.concatenate([[0], np.cumsum(counts)[:-1]])
        s.add_rows(names, block, first.tolist(), counts.tolist())
        for name, p0, c in zip(names, first, counts):
            want.setdefault(name, []).append(block[p0:p0 + c])
        if step == 4:
            s.add("late", block[:2])
            want["late"] = [block[:2]]
    assert s.points() == list(want)              # first arrival order
    for name, parts in want.items():
        assert np.array_equal(s.sums(name), np.concatenate(parts))


def test_merging_past_the_cap_pairs_until_under_it(monkeypatch):
    from ladder.engine import systematic
    monkeypatch.setattr(systematic, "MAX_CLUSTERS", 4)
    rows = np.arange(11 * NCOLS, dtype=float).reshape(11, NCOLS)
    s = Systematic()
    s.add("p", rows)
    got = s.sums("p")
    padded = np.concatenate([rows, np.zeros((1, NCOLS))])
    pairs = padded[0::2] + padded[1::2]                          # 6 rows, still past 4
    assert np.array_equal(got, pairs[0::2] + pairs[1::2])
    assert np.array_equal(got.sum(0), rows.sum(0))
