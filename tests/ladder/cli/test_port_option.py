"""`run --port M:F` as a porter adapting their own PyTorch port meets it (issue 48 item 7):
the schedule's window reaches the factory (cfg.kv_window) or the run is refused, the geometry
check runs as for our port, hidden_points takes either spelling, and a trace that breaks the
protocol is the port's mistake (exit 2), never called a divergence."""
import sys
import textwrap

import pytest

from ladder.cli.main import main

SHORT = ["--prompt-len", "2", "--steps", "2", "--no-check-plain"]


def _run(argv, capsys):
    lines = []
    rc = main(argv, out=lines.append)
    return rc, "\n".join(map(str, lines)) + capsys.readouterr().err


@pytest.fixture
def porter(tmp_path, monkeypatch):
    """A module beside the test holding ports built on tests.ports.toy_port."""
    (tmp_path / "porter_ports.py").write_text(textwrap.dedent('''
        from tests.ports.toy_port import ToyPort


        class NoWindow(ToyPort):                 # a state with no `window` to check
            def make_state(self):
                s = super().make_state()
                del s.window
                return s


        class OwnWindow(ToyPort):                # ignores cfg.kv_window: always 8
            def make_state(self):
                s = super().make_state()
                s.window = 8
                return s


        class Hides(ToyPort):
            hidden_points = {}

            def step_traced(self, token, state, logits, trace):
                def drop(name, layer, values):
                    if not (name == "hres" and layer == 0):
                        trace(name, layer, values)
                return super().step_traced(token, state, logits,
                                           None if trace is None else drop)


        def no_window(p, c): return NoWindow(p, c)
        def own_window(p, c): return OwnWindow(p, c)
        def hides(name):
            def build(p, c):
                port = Hides(p, c)
                port.hidden_points = {name: "fused into the lane kernel"} if name else {}
                return port
            return build
        hides_full, hides_bare = hides("L00.hres"), hides("hres")
        hides_typo, hides_nothing = hides("L00.hress"), hides(None)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("porter_ports", None)


def test_the_window_reaches_the_factory_through_cfg(capsys):
    rc, text = _run(["run", "--port", "tests.ports.toy_port:build", "--window", "4", *SHORT],
                    capsys)
    assert rc == 0, text[-1500:]
    assert "needle-parity run: " in text and "needle-parity compare" not in text
    assert "window 4" in text


def test_a_window_the_port_cannot_be_checked_to_take_is_refused(porter, capsys):
    rc, text = _run(["run", "--port", "porter_ports:no_window", "--window", "4", *SHORT],
                    capsys)
    assert rc == 2 and "has no `window` attribute" in text and "Traceback" not in text
    rc, text = _run(["run", "--port", "porter_ports:no_window", *SHORT], capsys)
    assert rc == 0, text[-1500:]                   # the model's own window: nothing to pass


def test_a_port_that_ignores_the_window_is_refused_naming_both(porter, capsys):
    rc, text = _run(["run", "--port", "porter_ports:own_window", "--window", "4", *SHORT],
                    capsys)
    assert rc == 2 and "steps on a window of 8; the schedule's is 4" in text


def test_the_geometry_check_runs_for_a_port_too(capsys):
    rc, text = _run(["run", "--port", "tests.ports.toy_port:build", "--window", "99", *SHORT],
                    capsys)
    assert rc == 2 and "--window 99: must lie in 1..8" in text
    rc, text = _run(["run", "--port", "tests.ports.toy_port:build", "--prompt-len", "60",
                     "--steps", "10"], capsys)
    assert rc == 2 and "exceeds the model's max_seq_len=64" in text


@pytest.mark.parametrize("factory", ["hides_full", "hides_bare"])
def test_hidden_points_take_the_full_or_the_per_layer_name(porter, capsys, factory):
    rc, text = _run(["run", "--port", f"porter_ports:{factory}", *SHORT], capsys)
    assert rc == 0, text[-1500:]
    assert "fused into the lane kernel" in text


def test_a_hidden_points_typo_is_refused_naming_it(porter, capsys):
    rc, text = _run(["run", "--port", "porter_ports:hides_typo", *SHORT], capsys)
    assert rc == 2 and "hidden_points key 'L00.hress' is not a registry point" in text


def test_a_point_the_port_does_not_trace_is_its_mistake_not_a_divergence(porter, capsys):
    rc, text = _run(["run", "--port", "porter_ports:hides_nothing", *SHORT], capsys)
    assert rc == 2, text[-1500:]
    assert "divergence" not in text
    assert "missing ['L00.hres']" in text and "or names it in hidden_points" in text


@pytest.mark.parametrize("spec,needle", [
    ("os:getcwd", "'getcwd' takes ()"),
    ("tests.ports.toy_port:ToyPort.step_traced", "takes (self, token, state, logits, trace)"),
])
def test_a_callable_that_cannot_take_params_and_cfg_is_no_factory(capsys, spec, needle):
    rc, text = _run(["run", "--port", spec, *SHORT], capsys)
    assert rc == 2 and "called as factory(params, cfg)" in text and needle in text, text[-800:]
    assert "Traceback" not in text
