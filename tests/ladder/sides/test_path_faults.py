"""Paths the port runs besides the one-position `step_traced` the ladder records (issue 24 §1):
`prefill_batch` and the decode body (`--decode graph`) are traced at the registry's points, and
a bug that lives only in one of them is located (path, step, point, layer), not blamed on
tracing; tracing them still changes no bit."""
import pytest
import torch

from ladder.sides.capture import BatchRecorder, PathError, capture_port
from ladder.cli.main import main
from ladder.engine.compare import first_bit_difference
from ladder.sides.path_faults import PATH_FAULTS
from ladder.engine.trace import Ladder, PortRecorder, schedule
from tests.captures import setup
from port.batch import V2Batch
from port.model import V2Model

STEPS = 2                               # a short schedule: prefill + 2 decode steps


def _model(decode="eager"):
    cfg, params = setup()[:2]
    return V2Model.from_params(params, cfg, decode=decode)


def _tokens():
    _, _, _, tokens, prompt = setup()
    return tokens[:prompt + STEPS], prompt


@pytest.mark.parametrize("name", sorted(PATH_FAULTS))
def test_a_path_only_fault_is_located_in_its_path(name):
    fault = PATH_FAULTS[name]
    cfg = setup()[0]
    tokens, prompt = _tokens()
    model = _model(fault.decode)
    clean = capture_port(model, tokens, prompt)
    with fault.plant():
        # The one-position step_traced never runs the faulty path: its ladder is unchanged ...
        assert first_bit_difference(capture_port(model, tokens, prompt), clean) is None
        # ... and the plain check names the path, step, point and position where it parts.
        with pytest.raises(PathError) as e:
            capture_port(model, tokens, prompt, check_plain=True)
    step, point, pos = fault.touches(cfg, prompt)
    err = e.value
    assert (err.path, err.step, err.point, err.position) == (fault.path, step, point, pos), err
    layer = int(point[1:3])
    assert f"{fault.path} differs from the one-position step_traced at {step}/{point} " \
           f"position {pos} (layer {layer})" in str(err)
    assert "is at fault" in str(err) and "tracing is not at fault" in str(err)
    assert "tracing must not change a bit" not in str(err)
    capture_port(model, tokens, prompt, check_plain=True)     # unplanted: clean again


@pytest.mark.parametrize("name", sorted(PATH_FAULTS))
def test_run_and_locate_exit_1_naming_the_path(name, capsys):
    fault = PATH_FAULTS[name]
    step, point, pos = fault.touches(setup()[0], setup()[4])
    for cmd in ("run", "locate"):
        with fault.plant():
            rc = main([cmd, "--steps", str(STEPS), "--decode", fault.decode],
                      out=lambda *_: None)
        err = capsys.readouterr().err
        assert rc == 1, err
        assert f"divergence: port (torch, {fault.decode}, dense, cpu" in err
        assert f"{fault.path} differs from the one-position step_traced at {step}/{point} " \
               f"position {pos}" in err


def test_no_check_plain_says_what_it_left_unchecked():
    lines = []
    with PATH_FAULTS["prefill_batch_only_engram_row"].plant():
        assert main(["run", "--steps", "1", "--no-check-plain"], out=lines.append) == 0
    said = [ln for ln in lines if ln.startswith("not checked (--no-check-plain)")]
    assert said == ["not checked (--no-check-plain): the port's plain paths (prefill_batch, "
                    "step) did not run, so a bug only in them goes unseen, nor that tracing "
                    "changes no bit"], lines


def test_tracing_the_paths_changes_no_bit():
    tokens, prompt = _tokens()
    model = _model("graph")
    plain, traced = model.make_state(), model.make_state()
    rec = BatchRecorder()
    a = model.prefill_batch(tokens[:prompt], plain, V2Batch(model), torch.empty(256))
    b = model.prefill_batch(tokens[:prompt], traced, V2Batch(model), torch.empty(256), trace=rec)
    assert torch.equal(a, b)
    assert rec.rows["L01.bx"][0].shape[0] == prompt and "logits" in rec.tail
    for st in schedule(tokens, prompt)[1:]:
        r = PortRecorder(Ladder([st]), st)
        r.next_position()
        a = model.step(int(st.tokens[0]), plain).clone()
        b = traced.decode_graph(model).step(int(st.tokens[0]), trace=r)
        r.finish()
        assert torch.equal(a, b) and "L05.x" in r.parts
    for name in ("k", "v", "vraw", "lanes", "hidden"):
        assert torch.equal(getattr(plain, name), getattr(traced, name)), name


def test_a_batched_trace_over_chunks_equals_the_one_position_ladder():
    # Every row of every chunk (cap 4 over a 6-token prompt: two chunks) at the registry's
    # per-row points, the tail points for the prompt's last row: bit for bit the ladder's.
    tokens, prompt = _tokens()
    model = _model()
    lad = capture_port(model, tokens, prompt)
    rec = BatchRecorder()
    model.prefill_batch(tokens[:prompt], model.make_state(), V2Batch(model, cap=4),
                        torch.empty(256), trace=rec)
    assert [t.shape[0] for t in rec.rows["embed"]] == [4, 2]
    for point in lad.points("prefill"):
        want = lad[f"prefill/{point}"]
        for j in range(prompt):
            got = rec.at(point, j, prompt)
            if point in rec.tail:
                assert (got is None) == (j < prompt - 1), point
            if got is not None:
                assert torch.equal(got, want[j]), (point, j)
    assert set(rec.rows) | set(rec.tail) == set(lad.points("prefill"))


def test_plant_a_path_fault_from_the_cli(capsys):
    lines = []
    rc = main(["run", "--plant", "graph_body_only_rope_sin", "--decode", "graph", "--steps", "1"],
              out=lines.append)
    assert rc == 1 and lines[0].startswith("planted fault graph_body_only_rope_sin in the "
                                           "decode body only (torch)")
    assert "the decode body differs from the one-position step_traced at decode00/L00.q" \
        in capsys.readouterr().err
    # Planted where its path does not run, it refuses (exit 2) instead of planting nothing.
    assert main(["run", "--plant", "graph_body_only_rope_sin"], out=lines.append) == 2
    assert "runs only with --backend torch --decode graph" in capsys.readouterr().err
