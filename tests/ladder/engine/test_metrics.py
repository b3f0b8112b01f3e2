"""The comparison's metrics (ladder/engine/metrics.py via compare_point), each against a value
worked by hand: max abs, max rel and its floor, ULP, cosine, SQNR, NaN/Inf counts; 16-bit inputs.
"""
import math
import pytest
import torch
from ladder.engine.compare import compare_ladders, compare_point, metrics
from ladder.engine.rules import Rule
from ladder.engine.trace import Ladder
# ---------------------------------------------------------------- the registry's shape check
# ---------------------------------------------------------------- fixture bounds, edge and past


# b and a, all exact binary fractions: d = |a - b| = [0.5, 0, 2^-7, 1], |b| = [1, 2, 0, 4]
B = torch.tensor([[1.0, -2.0, 0.0, 4.0]])


A = torch.tensor([[1.5, -2.0, 2.0 ** -7, 3.0]])


def _bits(x: float) -> int:
    import struct
    return struct.unpack("<i", struct.pack("<f", x))[0]


def test_max_abs_max_rel_and_its_floor_by_hand():
    m = metrics(A, B, 1e-3)
    assert m["max_abs"] == 1.0
    # denominators max(|b|, 1e-3 * max|b| = 4e-3): [1, 2, 4e-3, 4] -> the zero element rules
    assert m["max_rel"] == pytest.approx(2.0 ** -7 / 4e-3, rel=1e-12)
    # a floor of 0.5 * max|b| = 2 lifts the first and third denominators to 2
    assert metrics(A, B, 0.5)["max_rel"] == pytest.approx(0.25, rel=1e-12)
    # the floor is max(|b|, floor), not |b| + floor: an element above the floor keeps |b|
    assert metrics(A, B, 0.1)["max_rel"] == pytest.approx(0.5, rel=1e-12)


def test_ulp_by_hand_in_float32_float64_and_across_zero():
    m = metrics(A, B, 1e-3)
    # the worst is 0 -> 2^-7: its float32 bit pattern counts every ULP above zero
    assert m["ulp"] == _bits(2.0 ** -7) == 120 << 23
    # the smallest normal either side of zero (the suite flushes subnormals): its bit
    # pattern 1 << 23 counted on each side, not 2^31 apart
    tiny = torch.tensor([[2.0 ** -126]])
    assert metrics(tiny, -tiny, 1e-3)["ulp"] == 2 << 23
    assert metrics(-tiny, tiny, 1e-3)["ulp"] == 2 << 23
    # float64 pairs count float64 ULPs
    x = torch.tensor([[1.0]], dtype=torch.float64)
    y = torch.nextafter(x, torch.tensor(2.0, dtype=torch.float64))
    assert metrics(y, x, 1e-3)["ulp"] == 1
    seven = torch.from_numpy(x.numpy().view("int64") + 7).view(torch.float64)
    assert metrics(seven, x, 1e-3)["ulp"] == 7 and metrics(x, seven, 1e-3)["ulp"] == 7
    small = torch.tensor([[2.0 ** -1022]], dtype=torch.float64)      # bits 1 << 52
    assert metrics(small, -small, 1e-3)["ulp"] == 2.0 ** 53
    # one float64 side: compared in float32 (1 + 2^-52 rounds to 1)
    assert metrics(y, x.float(), 1e-3)["ulp"] == 0


def test_cosine_and_sqnr_by_hand():
    m = metrics(A, B, 1e-3)
    dot = 1.5 + 4.0 + 12.0
    na2, nb2 = 1.5 ** 2 + 4.0 + 2.0 ** -14 + 9.0, 21.0
    assert m["cosine"] == pytest.approx(dot / math.sqrt(na2 * nb2), rel=1e-12)
    noise = 0.25 + 2.0 ** -14 + 1.0
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(nb2 / noise), rel=1e-12)
    # zero signal with noise: -inf dB; anti-parallel: cosine -1
    z = torch.zeros(1, 4)
    assert metrics(B, z, 1e-3)["sqnr_db"] == -math.inf
    assert metrics(-B, B, 1e-3)["cosine"] == pytest.approx(-1.0, abs=1e-15)


def test_nan_inf_counts_each_way_and_finite_part_statistics():
    a = torch.tensor([[float("nan"), float("inf"), -float("inf"), 1.0, 5.0]])
    b = torch.tensor([[0.0, 1.0, 2.0, float("-inf"), 3.0]])
    m = metrics(a, b, 1e-3)
    assert (m["nan_a"], m["nan_b"], m["inf_a"], m["inf_b"]) == (1, 0, 2, 1)
    assert m["max_abs"] == 2.0                     # only 5 vs 3 is finite on both sides
    assert math.isnan(m["cosine"]) and math.isnan(m["sqnr_db"])
    r = compare_point("s", "L00.x", a, b, "t/*", Rule(1e3), 1e-3)
    assert not r.passed and r.error == math.inf and (r.nan_a, r.inf_a, r.inf_b) == (1, 2, 1)


def test_bfloat16_and_float16_values_are_compared_as_float32_and_said_so():
    import torch
    from tests.captures import reference_ladder
    ref = reference_ladder()
    for dt in (torch.bfloat16, torch.float16):
        low = Ladder(ref.steps, {k: v.to(dt) for k, v in ref.values.items()}, "port " + str(dt))
        exact = Ladder(ref.steps, {k: v.to(dt).float() for k, v in ref.values.items()}, "ref")
        cmp = compare_ladders(low, exact)          # a TypeError from numpy without the upcast
        assert cmp.passed and all(r.max_abs == 0 for r in cmp.rows)
        note = f"compared as float32 (a is {str(dt)[6:]}; ulp in float32 units)"
        assert all(note in r.note for r in cmp.rows), cmp.rows[0].note
        assert note in str(cmp.rows[0])
        # still judged: rounding to 16 bits is far outside the port's float32 allowance
        assert not compare_ladders(low, ref).passed
