"""Student's t tail against its closed forms, and Holm's step-down against a hand count."""
import math

import pytest

from ladder.engine.student import holm, incomplete_beta, t_sf, two_sided


@pytest.mark.parametrize("t", [-3.0, -0.5, 0.0, 0.3, 1.0, 2.5, 10.0, 1e3])
def test_the_tail_matches_the_closed_forms_at_one_and_two_degrees(t):
    cauchy = 0.5 - math.atan(t) / math.pi                      # df = 1
    two = 0.5 - t / (2 * math.sqrt(t * t + 2))                 # df = 2
    assert t_sf(t, 1) == pytest.approx(cauchy, rel=1e-12, abs=1e-15)
    assert t_sf(t, 2) == pytest.approx(two, rel=1e-12, abs=1e-15)


def test_many_degrees_approach_the_normal_tail():
    for z in (1.0, 3.0, 6.0):
        normal = 0.5 * math.erfc(z / math.sqrt(2))
        assert t_sf(z, 1e7) == pytest.approx(normal, rel=1e-5)


def test_the_tail_is_heavier_on_few_degrees_and_exact_at_the_ends():
    assert t_sf(5.0, 3) > t_sf(5.0, 30) > t_sf(5.0, 3000)
    assert t_sf(math.inf, 5) == 0.0 and t_sf(-math.inf, 5) == 1.0
    assert math.isnan(t_sf(math.nan, 5))
    assert two_sided(-2.0, 7) == pytest.approx(2 * t_sf(2.0, 7))
    assert incomplete_beta(2.0, 3.0, 0.0) == 0.0 and incomplete_beta(2.0, 3.0, 1.0) == 1.0
    # I_x(1, 1) = x, I_x(a, 1) = x^a
    assert incomplete_beta(1.0, 1.0, 0.3) == pytest.approx(0.3, rel=1e-12)
    assert incomplete_beta(2.5, 1.0, 0.4) == pytest.approx(0.4 ** 2.5, rel=1e-12)


def test_holm_adjusts_by_rank_and_keeps_the_order_monotone():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 -> max 0.06)
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.9, 0.8]) == [1.0, 1.0]
    assert holm([]) == []
