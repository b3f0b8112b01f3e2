"""locate's local-vs-propagated split must be able to say "inherited": an error that arrives
with a layer's inputs (from an earlier layer, or through the KV ring from earlier positions)
is not blamed on the layer where it first shows. And the numbers locate prints agree with the
comparison's first divergence (same position, same error)."""
import contextlib

from ladder.sides.capture import capture_port
from ladder.engine.compare import compare_ladders, error_text
from ladder.sides.faults import planted
from ladder.engine.locate import locate
from ladder.engine.rules import DEFAULT_RULES, Rule, RuleSet
from ladder_common import port_model, reference_ladder, setup


def _locate(fault_ctx, rules=DEFAULT_RULES):
    cfg, params, _, tokens, prompt = setup()
    ref = reference_ladder()
    model = port_model()
    with fault_ctx:
        bad = capture_port(model, tokens, prompt)
        cmp = compare_ladders(bad, ref, rules)
        loc = locate(cmp, port=bad, ref=ref, model=model)
    return cmp, loc


def test_an_earlier_layers_error_is_inherited_by_the_next():
    """The attention gate is skipped in every layer; with layer 0's points under a loose rule
    the first divergence shows in layer 1, which re-run on the reference's inputs passes at
    that point: its error is inherited from layer 0."""
    loose_l00 = RuleSet(rules={"port/L00.*": Rule(10.0), **DEFAULT_RULES.rules})
    cmp, loc = _locate(planted("attn_gate_skipped"), loose_l00)
    assert (loc.layer, loc.point, loc.position) == (1, "L01.nx", 0), str(loc)
    at = {r.point: r for r in loc.injection}["L01.nx"]
    assert at.propagated > 1.0 >= at.local and not at.own, str(loc)
    assert loc.verdict.startswith("inherited"), str(loc)
    assert "L01.nx" in str(loc) and "<- inherited" in str(loc)


@contextlib.contextmanager
def corrupted_ring_key(layer: int, pos: int, delta: float = 1.0):
    """After the step at `pos`, the key `layer` stored in the ring is off by `delta`: every
    captured value at `pos` is right, the next positions attend to a wrong key."""
    from port.model import V2Model
    orig = V2Model.run_step

    def run_step(self, token, state, **kw):
        out = orig(self, token, state, **kw)
        if state.pos - 1 == pos:
            state.k[layer, :, pos % state.ring] += delta
        return out
    V2Model.run_step = run_step
    try:
        yield
    finally:
        V2Model.run_step = orig


def test_a_wrong_kv_history_is_inherited_through_the_ring():
    """Injection replaces the layer's earlier K/V rows with the reference's, so the layer
    re-run at the failing position passes: the error came from earlier positions."""
    cmp, loc = _locate(corrupted_ring_key(2, 2))
    assert (loc.step, loc.point, loc.position) == ("prefill", "L02.attn", 3), str(loc)
    at = {r.point: r for r in loc.injection}["L02.attn"]
    assert at.propagated > 1.0 >= at.local and not at.own, str(loc)
    assert loc.verdict.startswith("inherited"), str(loc)
    layers = {r.point: r for r in loc.layers}
    assert layers["L02.x"].propagated > 1.0 >= layers["L02.x"].local, str(loc)


def test_locate_reports_the_first_failing_position_and_its_error():
    """RoPE at pos+1 in layer 3 fails q at position 0 already (and worst at position 1):
    locate re-runs position 0, and the first-divergence row, the bisection and the
    injection table all print the same error there."""
    cmp, loc = _locate(planted("rope_pos_plus_1"))
    first = cmp.first
    assert first.key == "prefill/L03.q" and first.first_bad_pos == 0 != first.worst_pos
    assert loc.position == 0
    at = {r.point: r for r in loc.injection}["L03.q"]
    assert at.propagated == first.first_bad_error == first.error_at(0)
    shown = error_text(first.first_bad_error)
    assert f"err {shown:>9s} of allowance" in str(first)
    text = str(loc)
    assert f"q           FAIL  err {shown:>10s}  <- first failing" in text, text
