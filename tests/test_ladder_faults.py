"""The harness must find real bugs: every planted fault is located at exactly the first capture
point it touches, and the clean port passes everything."""
import pytest
import torch

from ladder.capture import capture_port
from ladder.compare import compare_ladders, first_bit_difference
from ladder.faults import FAULTS, FaultError, _mutated_layer, planted
from ladder.locate import locate
from ladder_common import clean_port_ladder, port_model, reference_ladder, setup


@pytest.mark.parametrize("weights", ["dense", "cq"])
def test_clean_port_passes_every_point(weights):
    if weights == "cq" and FAULTS["cq_norms_f32"].needs:      # CQ port not (yet) present
        pytest.skip(FAULTS["cq_norms_f32"].needs)
    cmp = compare_ladders(clean_port_ladder(weights), reference_ladder(weights))
    assert cmp.passed and cmp.first is None, str(cmp)
    assert len(cmp.rows) == len(reference_ladder(weights))
    assert all(r.passed and r.argmax_agree for r in cmp.logits)
    assert locate(cmp) is None


def _faulty(name):
    fault = FAULTS[name]
    cfg, params, model, tokens, prompt = setup()
    ref = reference_ladder(fault.weights)
    if fault.weights != "dense" and not fault.at_load:
        model = port_model(fault.weights)
    with planted(name):
        if fault.at_load:
            model = port_model(fault.weights)
        bad = capture_port(model, tokens, prompt)
        cmp = compare_ladders(bad, ref)
        loc = locate(cmp, port=bad, ref=ref, model=model)
    return bad, cmp, loc


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault_is_located_at_the_first_point_it_touches(name):
    fault = FAULTS[name]
    if not fault.available:
        pytest.skip(f"{name}: {fault.needs}")
    cfg, params, model, tokens, prompt = setup()
    bad, cmp, loc = _faulty(name)
    point, earliest = fault.touches(cfg)
    # The oracle involves no tolerance: the first value the fault changes at all.
    clean = clean_port_ladder(fault.weights)
    step, touched, pos = first_bit_difference(bad, clean)
    assert touched == point, f"{name} touches {touched} first, declares {point}"
    assert pos == earliest if fault.exact else pos >= earliest
    # The harness, under the tolerance rules, against the reference: the same point.
    assert loc is not None, f"{name} went undetected"
    assert (loc.step, loc.point) == (step, touched), str(loc)
    assert loc.position == pos if fault.exact else loc.position >= pos
    if loc.layer is not None:          # the layer at fault is its own culprit
        own = {r.point: r for r in loc.injection}[loc.point]
        assert own.own and own.propagated > 1.0, str(loc)
    # Leaving the context restores the port bit for bit.
    fresh = port_model(fault.weights)
    assert torch.equal(fresh.step(tokens[0], fresh.make_state()), clean["prefill/logits"][0])


def test_injection_tells_own_error_from_inherited():
    cfg = setup()[0]
    _, cmp, loc = _faulty("y_minus_bx")          # wrong on Engram layers only
    first_site = min(cfg.engram_layers)
    assert loc.layer == first_site
    for r in loc.layers:
        i = int(r.point[1:3])
        assert r.own == (i in cfg.engram_layers), str(loc)            # local error
        assert (r.propagated > 1.0) == (i >= first_site), str(loc)   # what the chain carries
    assert "own error" in loc.verdict


def test_a_stale_mutation_refuses_instead_of_planting_nothing():
    with pytest.raises(FaultError, match="expected exactly one 'no such line'"):
        _mutated_layer("demo", "no such line", "x")


def test_an_unavailable_fault_says_what_it_needs(monkeypatch):
    import port.cq
    monkeypatch.delattr(port.cq.CqWeight, "_prerotation")
    with pytest.raises(FaultError, match="cq_norms_f32 cannot be planted: .*_prerotation"):
        planted("cq_norms_f32")
    with pytest.raises(KeyError, match="no fault 'nope'"):
        planted("nope")
