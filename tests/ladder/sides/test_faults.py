"""The harness must find real bugs: every planted fault is located at exactly the first capture
point it touches, in every backend it applies to (the torch port's Python and the native C
step, each planted in its own code), and the clean port passes everything."""
import functools

import pytest
import torch

from ladder.sides.capture import capture_port
from ladder.engine.compare import compare_ladders, first_bit_difference
from ladder.sides.faults import FAULTS, FaultError, _mutated_layer, planted
from ladder.engine.locate import locate
from tests.captures import clean_port_ladder, cq_file, port_model, reference_ladder, setup
from port.model import V2Model

# triton's prefill shares every patched method with torch, and its decode steps (the fused body)
# get each fault's fused form (tests/port/test_fused.py sweeps those on the twin kernels); it runs
# under the Triton interpreter on CPU, too slow for a full sweep here.
BACKENDS = ("torch", "native")


def _model(weights, backend):
    if backend == "torch":
        return port_model(weights)
    cfg, params = setup()[:2]
    if weights == "dense":
        return V2Model.from_params(params, cfg, backend="native")
    return V2Model.from_cactfile(cq_file(), weights, backend="native")


@functools.lru_cache(None)
def _clean(weights, backend):
    if backend == "torch":
        return clean_port_ladder(weights)
    _, _, _, tokens, prompt = setup()
    return capture_port(_model(weights, backend), tokens, prompt)


@pytest.mark.parametrize("weights", ["dense", "cq"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_clean_port_passes_every_point(weights, backend, ladder_models, ladder_check):
    # through the pytest plugin, as a port maintainer's suite checks its port
    model = ladder_models.get(weights=weights)
    verdict = ladder_check(_model(weights, backend), model=model)
    cmp = verdict.cmp
    assert cmp.passed and cmp.first is None and verdict.location is None, str(cmp)
    assert len(cmp.rows) == len(verdict.yardstick) == len(reference_ladder(weights))
    assert all(r.passed and r.argmax_agree for r in cmp.logits)
    assert locate(cmp) is None


def _faulty(name, backend="torch", weights=None):
    fault = FAULTS[name]
    weights = weights or fault.weights
    _, _, _, tokens, prompt = setup()
    ref = reference_ladder(weights)
    model = None if fault.at_load else _model(weights, backend)
    with planted(name, backend):
        if fault.at_load:
            model = _model(weights, backend)
        bad = capture_port(model, tokens, prompt)
        cmp = compare_ladders(bad, ref)
        loc = locate(cmp, port=bad, ref=ref, model=model)
    return bad, cmp, loc


def _cases():
    return [(n, b) for n in sorted(FAULTS) for b in BACKENDS]


@pytest.mark.parametrize("name,backend", _cases())
def test_fault_is_located_at_the_first_point_it_touches(name, backend):
    fault = FAULTS[name]
    if fault.not_in(backend):          # says so instead of planting nothing
        with pytest.raises(FaultError, match=f"{name} cannot be planted: not in backend "
                                             f"{backend}: .+"):
            planted(name, backend)
        return
    cfg, params, model, tokens, prompt = setup()
    bad, cmp, loc = _faulty(name, backend)
    point, earliest = fault.touches(cfg)
    # The oracle involves no tolerance: the first value the fault changes at all, against the
    # same backend's clean run (so native's points are its own captures, not the torch port's).
    clean = _clean(fault.weights, backend)
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
    fresh = _model(fault.weights, backend)
    assert torch.equal(fresh.step(tokens[0], fresh.make_state()), clean["prefill/logits"][0])


@pytest.mark.parametrize("weights", ["dense", "cq"])
def test_a_fault_in_the_c_step_is_blamed_on_its_own_layer(weights):
    # hpost = 1*sigmoid in needle_step.c only: locate re-runs the C layer (nat_layer), so the
    # local error at L00.hpost is the fault's, not a re-run of the torch layer's (issue 13).
    _, cmp, loc = _faulty("hpost_one", "native", weights)
    assert (loc.step, loc.point, loc.position) == ("prefill", "L00.hpost", 0), str(loc)
    own = {r.point: r for r in loc.injection}["L00.hpost"]
    assert own.own and own.local > 100, str(loc)
    assert "own error" in loc.verdict


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
    with pytest.raises(FaultError, match="switch NEEDLE_FAULT_ROPE_POS_PLUS_1 is fixed"):
        planted("rope_pos_plus_1", "native", shift=2)


def test_every_native_switch_is_in_the_c_source():
    # A switch the C source never tests would build a clean library: "nothing planted".
    import os
    from kernels import native
    src = "".join(open(os.path.join(os.path.dirname(native.__file__), f)).read()
                  for f in ("needle_step.c", "faults.h"))
    for f in FAULTS.values():
        if f.native.startswith("NEEDLE_FAULT_"):
            assert f"#ifdef {f.native}\n" in src, f.name


@pytest.mark.slow
@pytest.mark.parametrize("name", ["window_off_by_one"])
def test_triton_faults_on_a_short_schedule(name):
    # Triton attention runs under the interpreter on CPU: 8 positions (the window fills at
    # the 8th) instead of the sweep's 18, and the fault in what the kernel is handed (the
    # layer-math faults patch the same methods torch runs).
    from ladder.sides.capture import capture_reference
    cfg, params, _, tokens, prompt = setup()
    tokens = tokens[:cfg.kv_window]
    ref = capture_reference(params, cfg, tokens, prompt)
    model = V2Model.from_params(params, cfg, backend="triton",
                                device="cuda" if torch.cuda.is_available() else "cpu")
    point, pos = FAULTS[name].touches(cfg)
    with planted(name, "triton"):
        bad = capture_port(model, tokens, prompt)
        loc = locate(compare_ladders(bad, ref), port=bad, ref=ref, model=model)
    assert (loc.point, loc.position) == (point, pos), str(loc)
    assert {r.point: r for r in loc.injection}[point].own, str(loc)


@pytest.mark.parametrize("name", sorted(n for n, f in FAULTS.items() if f.weights == "dense"))
def test_faults_reach_the_graph_body(name):
    # decode="graph": the capture proves the graph body's plain steps give the traced eager
    # steps' logits bit for bit, so a fault planted in one path only stops it (TraceError).
    cfg, params, _, tokens, prompt = setup()
    model = V2Model.from_params(params, cfg, decode="graph")
    with planted(name):
        bad = capture_port(model, tokens, prompt, check_plain=True)
    point, _ = FAULTS[name].touches(cfg)
    assert first_bit_difference(bad, _clean("dense", "torch"))[1] == point
