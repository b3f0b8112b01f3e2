"""Calibration faults: each rule family of the default rules must catch an error just above the
bound the specification states and let one just below through. A gain error (1 + eps) on one
captured point of the clean port moves max|a - b| by eps·max|b|, so its error of allowance is
about eps / rtol plus the clean run's own (<= 0.11 of the allowance on tiny). eps sits at 0.7
and 1.3 of the stated bound: a rule loosened (or tightened) past those margins fails here.

The bounds are the project's statements, not read back from ladder/engine/rules.py (that would test
the rules against themselves): issue #4 logits 1e-5·max|logits|, spec §f.17 3e-5 between
correct f32 implementations, the Sinkhorn plan 5e-6 (rules.py's measured reason)."""
import pytest
import torch

from ladder.engine.compare import compare_ladders
from ladder.engine.rules import DEFAULT_RULES
from ladder.engine.trace import Ladder
from tests.captures import clean_port_ladder, reference_ladder

STATED = {"port/logits": 1e-5, "port/*": 3e-5, "port/L*.hres": 5e-6}
POINTS = [("logits", "port/logits"), ("L01.hres", "port/L*.hres"), ("L04.hres", "port/L*.hres"),
          ("embed", "port/*"), ("engram_k1", "port/*"), ("L02.q", "port/*"),
          ("L03.attn_out", "port/*"), ("L05.x", "port/*"), ("final_norm", "port/*")]


def _only(ladder: Ladder, point: str, eps: float = 0.0) -> Ladder:
    """`ladder` cut down to `point`, scaled by (1 + eps) at every step (computed in float64,
    rounded once to float32)."""
    values = {}
    for st in ladder.steps:
        key = f"{st.name}/{point}"
        values[key] = (ladder[key].double() * (1 + eps)).to(ladder[key].dtype)
    return Ladder(ladder.steps, values, ladder.label)


@pytest.mark.parametrize("point,family", POINTS)
@pytest.mark.parametrize("factor,passes", [(0.0, True), (0.7, True), (1.3, False)])
def test_a_gain_error_near_the_stated_bound(point, family, factor, passes):
    assert DEFAULT_RULES.pattern_for(f"port/{point}") == family
    port = _only(clean_port_ladder(), point, factor * STATED[family])
    cmp = compare_ladders(port, _only(reference_ladder(), point))
    assert len(cmp.rows) == len(cmp.steps)
    assert cmp.passed is passes, "\n".join(str(r) for r in cmp.rows)


def test_the_zero_reference_floor_is_a_small_absolute_bound():
    """Engram values at position 0 are exact zeros in the reference (no complete n-gram): a
    port value of 0.5e-8 there passes, 2e-8 fails (ladder/engine/rules.py's ZERO_FLOOR is 1e-8)."""
    clean, ref = clean_port_ladder(), reference_ladder()
    assert torch.count_nonzero(ref["prefill/engram_v1"][0]) == 0
    for v, passes in ((0.5e-8, True), (2e-8, False)):
        port = _only(clean, "engram_v1")
        port.values["prefill/engram_v1"][0, 0] = v
        cmp = compare_ladders(port, _only(ref, "engram_v1"))
        assert cmp.row("prefill", "engram_v1").passed is passes
