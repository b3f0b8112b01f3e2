"""Injection on the native backend runs the C layer (nat_layer), not the torch one: re-running
layer i from the native step's own inputs gives the native step's own values bit for bit, and
`ladder locate --backend native --weights cq` prints its table on a divergence (issue 13)."""
import pytest
import torch

from ladder.cli.main import main
from ladder.engine.trace import point_name
from port.model import V2Model
from reference import cact


@pytest.fixture(scope="module", params=["dense", "cq"])
def native_model(request, tiny_cfg, tiny_params):
    if request.param == "dense":
        return V2Model.from_params(tiny_params, tiny_cfg, backend="native")
    return V2Model.from_cactfile(cact.build_cact(tiny_params, tiny_cfg), "cq", backend="native")


def _traced_run(model, tokens):
    """The native step's own captures per position: {point: [positions, ...]}."""
    state, got = model.make_state(), {}
    for t in tokens:
        seen = {}
        model.step_traced(t, state, None,
                          lambda name, i, v: seen.__setitem__(point_name(name, i), v.clone()))
        for k, v in seen.items():
            got.setdefault(k, []).append(v)
    return state, got


@pytest.mark.parametrize("layer,pos", [(0, 0), (2, 9), (5, 11)])
@pytest.mark.parametrize("engram", ["given", "computed in C"])
def test_step_layer_reruns_the_c_layer_bit_for_bit(native_model, tiny_cfg, layer, pos, engram):
    tokens = torch.randint(1, 256, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    # stepped through pos only, as locate does: later positions would overwrite ring slots
    state, own = _traced_run(native_model, tokens[:pos + 1])    # window 8: 9+ have wrapped
    lanes = own[point_name("x", layer - 1)][pos] if layer else \
        own["embed"][pos].expand(tiny_cfg.mhc_lanes, tiny_cfg.d_model)
    eng = [(own[f"engram_k{s}"][pos], own[f"engram_v{s}"][pos])
           for s in range(tiny_cfg.num_sites)] if engram == "given" else None
    before = [t.clone() for t in (state.k, state.v, state.lanes)]
    got = {}
    out = native_model.step_layer(layer, lanes, state.clone(), pos, engram=eng,
                                  trace=lambda name, i, v: got.__setitem__(point_name(name, i),
                                                                           v.clone()))
    assert torch.equal(out, own[point_name("x", layer)][pos])
    names = [k for k in own if k.startswith(f"L{layer:02d}.")]
    assert sorted(got) == sorted(names)
    for k in names:
        assert torch.equal(got[k], own[k][pos]), k
    assert all(torch.equal(a, b) for a, b in zip(before, (state.k, state.v, state.lanes)))


def test_step_layer_changes_with_the_c_code_not_the_torch_code(tiny_cfg, tiny_params):
    # The torch layer planted with a fault must not move the native re-run (it is not run).
    from ladder.sides.faults import planted
    model = V2Model.from_params(tiny_params, tiny_cfg, backend="native")
    state = model.make_state()
    for t in (5, 9, 11):
        model.step(t, state)
    lanes = torch.randn(tiny_cfg.mhc_lanes, tiny_cfg.d_model,
                        generator=torch.Generator().manual_seed(0))
    clean = model.step_layer(1, lanes, state.clone(), 2)
    with planted("hpost_one", "torch"):
        assert torch.equal(model.step_layer(1, lanes, state.clone(), 2), clean)
    with planted("hpost_one", "native"):
        assert not torch.equal(model.step_layer(1, lanes, state.clone(), 2), clean)


def test_locate_native_cq_on_a_divergence_prints_its_table(capsys):
    # Before: inject() read model.w["emb"], which the packed native model drops (KeyError).
    lines = []
    rc = main(["locate", "--backend", "native", "--weights", "cq", "--plant", "hpost_one"],
              out=lines.append)
    text = "\n".join(lines)
    assert rc == 1, text + capsys.readouterr().err
    assert "first divergence: prefill/L00.hpost" in text
    assert "hpost" in text and "<- own" in text
    assert "verdict: the layer's own error" in text
    assert "Traceback" not in capsys.readouterr().err


def test_run_plant_demo_exits_1_at_the_planted_point(capsys):
    lines = []
    rc = main(["run", "--backend", "native", "--plant", "hpost_one"], out=lines.append)
    text = "\n".join(lines)
    assert rc == 1, text
    assert lines[0].startswith("planted fault hpost_one in backend native")
    assert "first divergence: prefill/L00.hpost" in text


def test_list_faults_and_unplantable_faults(capsys):
    from ladder.sides.faults import FAULTS
    from ladder.sides.path_faults import PATH_FAULTS
    lines = []
    assert main(["run", "--list-faults"], out=lines.append) == 0
    lines = "\n".join(lines).splitlines()
    assert [ln.split()[0] for ln in lines] == list(FAULTS) + list(PATH_FAULTS)
    last = lines[len(FAULTS) - 1]
    assert "cq_norms_f32" in last and "backends torch, triton:" in last
    for argv, msg in ((["--plant", "nope"], "--plant nope: unknown"),
                      (["--plant", "cq_norms_f32"], "lives in cq weights"),
                      (["--plant", "cq_norms_f32", "--weights", "cq", "--backend", "native"],
                       "cannot be planted: not in backend native")):
        assert main(["run", *argv], out=lambda s: None) == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err


def test_graph_step_layer_runs_the_graph_body_layer(tiny_cfg, tiny_params, monkeypatch):
    # decode="graph": the re-run goes through the runtime's decode_body, as the graph does,
    # with the same bits as the eager layer; a bug only in decode_body moves it.
    from port.attn import AttnRuntime
    eager = V2Model.from_params(tiny_params, tiny_cfg)
    graph = V2Model.from_params(tiny_params, tiny_cfg, decode="graph")
    state = eager.make_state()
    for t in (5, 9, 11, 4, 7, 3, 8, 2, 6, 1):                 # past the window of 8
        eager.step(t, state)
    lanes = torch.randn(tiny_cfg.mhc_lanes, tiny_cfg.d_model,
                        generator=torch.Generator().manual_seed(1))
    run = lambda m, pos: m.step_layer(2, lanes, state.clone(), pos)
    assert torch.equal(run(graph, 9), run(eager, 9))
    body = AttnRuntime.decode_body
    monkeypatch.setattr(AttnRuntime, "decode_body",
                        lambda self, *a: (*body(self, *a)[:5], 2 * body(self, *a)[5]))
    assert not torch.equal(run(graph, 9), run(eager, 9))
    assert torch.equal(run(graph, 0), run(eager, 0))          # position 0: a prefill, eager


def test_native_step_layer_refuses_bad_requests(tiny_cfg, tiny_params):
    from port.model import StepError
    model = V2Model.from_params(tiny_params, tiny_cfg, backend="native")
    state = model.make_state()
    for t in (5, 9):
        model.step(t, state)
    before = state.k.clone()
    lanes = torch.zeros(tiny_cfg.mhc_lanes, tiny_cfg.d_model)
    with pytest.raises(StepError, match="engram holds 1 sites; the model has 2"):
        model.step_layer(0, lanes, state, 1, engram=[(lanes[0], lanes[0])])
    with pytest.raises(StepError, match="position 2 outside .* 0..1"):
        model.step_layer(0, lanes, state, 2)
    assert torch.equal(state.k, before)
