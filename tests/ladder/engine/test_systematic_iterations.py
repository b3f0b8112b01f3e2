"""The iteration-count statistic (systematic.iterations, systematic_sums.direction_sums) on
synthetic plans whose truth is known: records an iteration short, honest records that
differ from the replay for another reason, and a pattern repeated at every position."""
import math

import numpy as np
import pytest
import torch

from ladder.engine.systematic import Systematic
from ladder.engine.systematic_sums import DIRECTION, NCOLS, direction_sums, position_sums
from ladder.sweep.pooled import check_field

MARGINS = lambda point: (2.0 ** -8, 2.0 ** -8)


def bf16(x):
    return torch.from_numpy(np.asarray(x)).float().to(torch.bfloat16).double().numpy()


def plans(seed, C=40, n=4):
    """C positions of n x n values in (0, 1), a replay r (float32) and a one-iteration-short
    change g of about 2 % of a bfloat16 rounding, varying with the position."""
    rng = np.random.default_rng(seed)
    r = rng.uniform(0.05, 0.6, (C, n, n)).astype(np.float32).astype(np.float64)
    g = 6e-5 * rng.standard_normal((C, n, n))
    return rng, r, g


def judged(a, r, g):
    s = position_sums(a, r, r)
    s[:, DIRECTION] = direction_sums(a, bf16(r), g)
    sysm = Systematic()
    sysm.add("L02.hres (own op)", s)
    [res] = sysm.finish(MARGINS, 2.0 ** -7)
    return res


def test_records_an_iteration_short_fail_as_an_iteration_count():
    _, r, g = plans(0, C=400)
    res = judged(bf16(r + g), r, g)
    assert res.failed and res.kind == "iteration count", res.text()
    assert abs(res.iterations.value - 1) < 4 * res.iterations.se + 0.2, res.text()
    assert res.along == 1.0 and "one iteration fewer" in res.text()


@pytest.mark.parametrize("pull, status", [(0.05, "finding"), (0.2, "FAIL")])
def test_a_pull_inside_the_margin_is_a_finding_and_past_it_fails(pull, status):
    # a twentieth and a fifth of an iteration (margin ITERATION_MARGIN = 0.1), g 15 % of a
    # rounding so that 2000 positions resolve them
    rng = np.random.default_rng(5)
    r = rng.uniform(0.05, 0.6, (2000, 4, 4)).astype(np.float32).astype(np.float64)
    g = 3e-4 * rng.standard_normal(r.shape)
    res = judged(bf16(r + pull * g), r, g)
    assert res.status == status and res.kind == "iteration count", res.text()
    assert abs(res.iterations.value - pull) < 4 * res.iterations.se + 0.02, res.text()


def test_records_equal_to_the_stored_replay_have_no_pull():
    _, r, g = plans(1)
    res = judged(bf16(r), r, g)
    assert res.iterations.value == 0 and not (res.failed or res.finding), res.text()


def test_honest_records_off_for_another_reason_are_not_an_iteration_count():
    # a port that read its inputs unrounded: its records are off by ~10x g, and that error
    # shares a little of g's pattern (measured: pulls of -14 to 192 iterations on the
    # record-rounding port, tools/precision/systematic_false_alarms.py); most of its moves
    # go either way, where an op an iteration short moves every element g's way
    rng, r, g = plans(2, C=400)
    a = bf16(r + 6e-4 * rng.standard_normal(r.shape) + 5 * g)
    res = judged(a, r, g)
    assert res.iterations.significant and res.iterations.value > 3, res.text()
    assert res.along < 0.75 and not (res.failed or res.finding), res.text()


def test_a_pattern_repeated_at_every_position_is_one_piece_of_evidence():
    # the plan barely varies with the token: the same records, the same change at every
    # position; a pull there is indistinguishable from the replay's own rounding
    _, r, g = plans(3)
    r[:], g[:] = r[0], g[0]
    a = bf16(r + 40 * g)
    out = direction_sums(a, bf16(r), g)
    assert np.array_equal(out[:, :2], np.zeros((len(r), 2)))
    assert math.isnan(judged(a, r, g).iterations.p)


def test_one_position_gives_no_direction_sums():
    _, r, g = plans(4, C=1)
    assert np.array_equal(direction_sums(bf16(r + g), bf16(r), g), np.zeros((1, 4)))


def test_a_sweep_row_from_before_the_iteration_columns_is_read():
    old = {"unit": 0.0078125, "points": {"L00.x": {"margins": [0.004, 0.004],
                                                   "sums": [[1.0] * 8]}}}
    assert check_field(old) == ""
    old["points"]["L00.x"]["sums"] = [[1.0] * 9]
    assert f"lists of {NCOLS}" in check_field(old)


def test_the_report_table_carries_the_iteration_count():
    from ladder.engine.report import SYSTEMATIC_COLUMNS
    from ladder.engine.systematic_plot import systematic_frame
    _, r, g = plans(0, C=400)
    res = judged(bf16(r + g), r, g)
    frame = systematic_frame([res])
    assert {"iterations", "iterations_p", "iterations_along"} <= set(SYSTEMATIC_COLUMNS)
    row = frame.iloc[0]
    assert row["kind"] == "iteration count" and row["iterations"] == res.iterations.value
    assert row["iterations_along"] == 1.0
