"""A rule's error and allowance (ladder/engine/rule.py) against values worked by hand: the
mismatch fraction, the elementwise floor, the p99 statistic.
"""
import math
import pytest
import torch
from ladder.engine.compare import compare_point
from ladder.engine.rules import Rule
# ---------------------------------------------------------------- the registry's shape check
# ---------------------------------------------------------------- fixture bounds, edge and past


# b and a, all exact binary fractions: d = |a - b| = [0.5, 0, 2^-7, 1], |b| = [1, 2, 0, 4]
B = torch.tensor([[1.0, -2.0, 0.0, 4.0]])


A = torch.tensor([[1.5, -2.0, 2.0 ** -7, 3.0]])


def test_rule_error_mismatch_and_allowance_maxabs_by_hand():
    # allowance 0.1 * max|b| = 0.4: ratios [1.25, 0, 2^-7/0.4, 2.5]
    r = compare_point("s", "L00.x", A, B, "t/*", Rule(0.1), 1e-3)
    assert r.error == pytest.approx(2.5, rel=1e-12) and r.mismatch == 0.5 and not r.passed
    assert Rule(0.1).error(A, B) == pytest.approx(2.5, rel=1e-12)
    # atol adds to the allowance: 0.1 + 0.1 * 4 = 0.5 -> 1 / 0.5
    assert Rule(0.1, atol=0.1).error(A, B) == pytest.approx(2.0, rel=1e-12)
    # exactly at the allowance passes (<= 1), just past it fails
    assert Rule(0.25).check(A, B) and not Rule(0.2499).check(A, B)
    at = compare_point("s", "L00.x", A, B, "t/*", Rule(0.25), 1e-3)   # ratios [.5, 0, ~0, 1]
    assert at.passed and at.error == 1.0 and at.mismatch == 0.0


def test_rule_error_elementwise_and_the_floor_by_hand():
    # allowance per element 0.01 + 0.1 |b| = [0.11, 0.21, 0.01, 0.41]
    rule = Rule(0.1, atol=0.01, scale="elementwise")
    assert rule.error(A, B) == pytest.approx(0.5 / 0.11, rel=1e-12)
    errs = rule.position_errors(A, B)
    assert errs == pytest.approx([0.5 / 0.11], rel=1e-12)
    r = compare_point("s", "L00.x", A, B, "t/*", rule, 1e-3)
    assert r.mismatch == 0.5                       # elements 0 (4.5) and 3 (2.44) fail
    # no atol: the zero element has no allowance; the floor gives it 0.02
    bare = Rule(0.2, scale="elementwise")
    assert bare.error(A, B) == math.inf
    floored = Rule(0.2, scale="elementwise", floor=0.02)
    # ratios [0.5/0.2, 0, 2^-7/0.02, 1/0.8]
    assert floored.error(A, B) == pytest.approx(2.5, rel=1e-12)
    assert floored.ratios(A, B)[0, 2] == pytest.approx(2.0 ** -7 / 0.02, rel=1e-12)
    # maxabs: the floor decides an all-zero reference slice only
    z = torch.zeros(1, 3)
    assert Rule(0.1, floor=1e-3).error(z + 2.0 ** -11, z) == \
        pytest.approx(2.0 ** -11 / 1e-3, rel=1e-12)
    assert Rule(0.1, floor=1e-3).position_errors(z + 2.0 ** -11, z) == \
        pytest.approx([2.0 ** -11 / 1e-3], rel=1e-12)
    assert Rule(0.1).allowance(1.0) == 0.1 and Rule(0.1, floor=0.5).allowance(1.0) == 0.5


def test_p99_statistic_by_hand():
    b = torch.ones(1, 101)
    a = b.clone()
    a[0, 3] += 0.5           # ratio 4 (allowance 0.125)
    a[0, 50] += 0.25         # ratio 2
    rule = Rule(0.125, stat="p99")
    # sorted ratios: 99 zeros, 2, 4; torch's 0.99 quantile of 101 values is element 99
    assert rule.error(a, b) == 2.0
    assert rule.position_errors(a, b) == [2.0]
    a[0, 50] = 1.0
    assert rule.error(a, b) == 0.0 and rule.check(a, b)     # one bad element in 101 passes
    assert not Rule(0.125).check(a, b)                        # under "max" it fails
