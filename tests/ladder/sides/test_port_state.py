"""The ladder steps the port on the state users get: `make_state()` by default, `--window`
only when asked (and then it says so). A window bug in make_state() itself must fail the run."""
import pytest

from ladder.cli.main import main
from port.model import V2Model
from port.state import V2State


def run(*argv):
    lines = []
    rc = main(list(argv), out=lines.append)
    return rc, "\n".join(lines)


@pytest.fixture
def make_state_one_too_wide(monkeypatch):
    """make_state() with a ring and window of kv_window + 1: a plain step() on it attends to one
    position too many from position kv_window on."""
    def wide(self):
        w = self.cfg.kv_window + 1
        return V2State(self.cfg, ring=w, window=w, device=self.device)
    monkeypatch.setattr(V2Model, "make_state", wide)


def test_a_make_state_window_bug_fails_the_run(make_state_one_too_wide):
    rc, text = run("run", "--no-check-plain", "--steps", "4")    # 10 positions: past w = 8
    assert rc == 1, text
    assert "port state: make_state(): ring 9, window 9" in text
    assert "first divergence: " in text and "DIVERGENCE" in text


def test_window_override_is_said_and_replaces_make_state(make_state_one_too_wide):
    rc, text = run("run", "--no-check-plain", "--steps", "4", "--window", "8")
    assert rc == 0, text
    assert "port state: window 8 (overrides make_state()'s window 9; ring 9)" in text


def test_default_run_names_the_state_and_what_ran():
    rc, text = run("run", "--no-check-plain", "--steps", "2")
    assert rc == 0, text
    lines = text.splitlines()
    assert lines[0].startswith("needle-parity ladder: port (torch, eager, dense, cpu, ")
    assert "port: backend torch, decode eager, weights dense, device cpu, " in text
    assert "port state: make_state(): ring 8, window 8" in text


def test_graph_decode_prints_its_verdict():
    rc, text = run("run", "--decode", "graph", "--steps", "3")
    assert rc == 0, text
    assert "decode graph: graph step (body run eagerly on CPU) == traced eager step" in text
    rc, text = run("run", "--decode", "graph", "--steps", "1", "--no-check-plain")
    assert "decode graph: NOT checked against the eager step (--no-check-plain)" in text


def test_locate_and_report_name_what_ran(tmp_path):
    rc, text = run("locate", "--no-check-plain", "--steps", "1")
    assert rc == 0 and "port: backend torch, decode eager, weights dense, device cpu, " in text
    rc, text = run("report", "--no-check-plain", "--steps", "1", "--out", str(tmp_path),
                   "--plot", "svg")
    assert rc == 0, text
    md = (tmp_path / "ladder.md").read_text()
    assert "- port: backend torch, decode eager, weights dense, device cpu, " in md
    assert "- port state: make_state(): ring 8, window 8" in md


def test_native_header_names_the_c_threads():
    from kernels import native
    if not native.available():
        pytest.fail("the native step did not build (the suite needs a C compiler)")
    try:
        native.set_threads(2)
        rc, text = run("run", "--backend", "native", "--steps", "1", "--no-check-plain")
    finally:
        native.set_threads(1)
    assert rc == 0, text
    assert "port: backend native, decode eager, weights dense, device cpu, 2 C threads" in text


def test_a_windowless_config_runs_on_the_full_causal_state(tmp_path):
    from reference.config import V2Config
    from reference.params import init_params, save_params
    cfg = V2Config.preset("tiny").replace(kv_window=0)
    save_params(tmp_path / "p.safetensors", init_params(cfg, 0, perturbed=True), cfg)
    rc, text = run("run", "--params", str(tmp_path / "p.safetensors"), "--steps", "1",
                   "--no-check-plain", "--decode", "graph")
    assert rc == 0, text
    assert f"port state: make_state_full_causal(): ring {cfg.max_seq_len}, window 0" in text
    assert "decode graph: not exercised: make_state() is full causal" in text
