"""`python -m ladder shrink` (issue 29): a divergence shrunk to its smallest reproducer, kept
the same (first point, own/inherited), and handed back as a pytest file that fails on the bug
and passes without it."""
from tests import paths
import os
import subprocess
import sys

import pytest

from ladder.cli.main import main
from ladder.engine.shrink import CANONICAL, Divergence, Schedule, Search

ROOT = paths.ROOT


def _div(point="L00.q", verdict="own"):
    return Divergence(point, verdict, "prefill", 0, 2.0)


def _search(check, start, windows=range(1, 9)):
    return Search(check, _div(), windows).run(start)


def test_a_divergence_that_needs_no_wrap_loses_it_and_its_ids_go_canonical():
    # shows wherever id 7 is fed, whatever else
    check = lambda s: _div() if 7 in s.tokens else None                 # noqa: E731
    start = Schedule((3, 9, 7, 4, 4, 5, 6, 2), 3, 8)
    res = _search(check, start)
    assert res.best == Schedule((7,), 1, 1) and not res.best.wraps
    assert res.ratio() == 8 and res.tried > 0


def test_a_divergence_that_needs_the_ring_to_wrap_keeps_a_wrap():
    # shows only once the ring wraps and a decode step reads it
    check = lambda s: _div() if s.wraps and s.steps >= 1 else None      # noqa: E731
    start = Schedule(tuple(range(2, 14)), 6, 8)
    res = _search(check, start)
    assert res.best.wraps and len(res.best.tokens) == 2 and res.best.window == 1
    assert res.best.tokens == (CANONICAL, CANONICAL) and res.best.steps == 1


def test_another_divergence_is_not_kept():
    # smaller schedules show a different point: they are not the divergence asked for
    check = lambda s: _div() if len(s.tokens) >= 5 else _div("L01.y")   # noqa: E731
    res = _search(check, Schedule(tuple(range(2, 12)), 4, 8))
    assert len(res.best.tokens) == 5 and res.divergence.point == "L00.q"


def test_the_time_budget_stops_the_search_with_the_best_so_far():
    res = Search(lambda s: _div(), _div(), range(1, 9), max_time=0).run(
        Schedule(tuple(range(2, 12)), 4, 8))
    assert res.timed_out and res.tried == 0 and res.best == res.start


def _run(*argv):
    lines = []
    return main(list(argv), out=lines.append), "\n".join(lines)


def _pytest(d, *flags, env=None):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(d), *flags], capture_output=True, text=True, timeout=600,
                          cwd=str(d), env=env)


@pytest.mark.parametrize("backend, fault, want", [
    # the fault sits in layer 3: a sub-model of 4 layers keeps it, of 3 loses it
    ("torch", "rope_pos_plus_1",
     "smallest schedule: 1 position (prompt 1 + 0 steps), window 1, 4 layers"),
    ("native", "hpost_one", "smallest schedule: 1 position (prompt 1 + 0 steps), window 1, "
                            "1 layer"),
])
def test_shrink_a_planted_fault_and_the_emitted_test_fails_with_it_only(tmp_path, backend,
                                                                         fault, want):
    d = tmp_path / "repro"
    out = ["--out", str(d)] if backend == "torch" else []     # one reproducer run is enough
    rc, text = _run("shrink", "--backend", backend, "--plant", fault, "--no-check-plain", *out)
    assert rc == 0 and want in text, text
    assert f"{'L03.q' if fault == 'rope_pos_plus_1' else 'L00.hpost'} (own)" in text, text
    if not out:
        return
    assert sorted(os.listdir(d)) == ["README.md", "model.safetensors", "pytest.ini",
                                     "test_shrunk_divergence.py"]     # the sub-model's file
    bad = _pytest(d, "--ladder-plant", fault)
    assert bad.returncode == 1 and "1 failed" in bad.stdout, bad.stdout[-2000:]
    good = _pytest(d)
    assert good.returncode == 0 and "1 passed" in good.stdout, good.stdout[-2000:]
    # no file names the directory: moved whole and run from its parent, it fails the same
    for name in os.listdir(d):
        assert str(tmp_path).encode() not in (d / name).read_bytes(), name
    moved = tmp_path / "elsewhere" / "suite" / "repro_moved"
    moved.parent.mkdir(parents=True)
    d.rename(moved)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "suite/repro_moved", "--ladder-plant", fault], capture_output=True,
                         text=True, timeout=600, cwd=str(moved.parent.parent))
    assert res.returncode == 1 and "1 failed" in res.stdout, res.stdout[-2000:]


def _best(text):
    return text.split("smallest schedule:")[1].splitlines()[0]


def test_a_fault_that_needs_a_full_window_keeps_one_and_loses_the_wrap():
    # the window one position short shows once a position sees a full window (positions ==
    # window), not only after the ring wraps: the wrap of the 18-position start is lost
    rc, text = _run("shrink", "--plant", "window_off_by_one", "--no-check-plain",
                    "--prompt-len", "2", "--steps", "7")
    assert rc == 0 and "L00.attn (own)" in text, text
    assert " 2 positions (prompt 2 + 0 steps), window 2" in _best(text), text
    assert "wraps" not in _best(text) and "the ring wraps" in text.split("smallest")[0]


WRAP_PORT = """from port import V2Model


class RingBug:
    \"\"\"port.V2Model, with its layer-0 attention off by 1% once the ring has wrapped.\"\"\"

    def __init__(self, params, cfg):
        self.model, self.window = V2Model.from_params(params, cfg), cfg.kv_window

    def make_state(self):
        state = self.model.make_state()
        state.fed = 0
        return state

    def step_traced(self, token, state, logits, trace):
        pos, state.fed = state.fed, state.fed + 1

        def spoiled(name, layer, v):
            if name == "attn" and layer == 0 and pos >= self.window:
                v = v * 1.01
            return trace(name, layer, v)
        return self.model.step_traced(token, state, logits, spoiled)


def build(params, cfg):
    return RingBug(params, cfg)
"""


def test_a_port_bug_that_needs_the_ring_to_wrap_keeps_a_wrap(tmp_path, monkeypatch):
    (tmp_path / "wrap_port.py").write_text(WRAP_PORT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "repro"
    rc, text = _run("shrink", "--port", "wrap_port:build", "--no-check-plain", "--prompt-len",
                    "1", "--steps", "9", "--out", str(d))
    assert rc == 0 and "L00.attn" in text, text
    assert _best(text).startswith(" 9 positions") and "the ring wraps" in _best(text), text
    bad = _pytest(d)
    assert bad.returncode == 1 and "1 failed" in bad.stdout, bad.stdout[-2000:]


def test_nothing_to_shrink_writes_nothing(tmp_path):
    rc, text = _run("shrink", "--steps", "2", "--out", str(tmp_path / "o"))
    assert rc == 1 and "no divergence" in text and not (tmp_path / "o").exists()


def test_a_recording_cannot_be_shrunk(tmp_path, capsys):
    assert main(["shrink", "--dump", str(tmp_path / "x.safetensors")]) == 2
    assert "a recording is one fixed schedule" in capsys.readouterr().err


def test_a_sweep_case_is_shrunk_by_name_with_its_fault(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text('[sweep]\nname = "s"\n[grid]\nplant = ["none", "rope_pos_plus_1"]\n'
                    '[fixed]\npreset = "tiny"\nprompt_len = 3\nsteps = 2\nno_check_plain = true\n')
    rc, _ = _run("sweep", str(grid), "--out", str(tmp_path / "sw"))
    assert rc == 1
    failing = sorted(os.listdir(tmp_path / "sw" / "cases"))[1]          # the planted case
    rc, text = _run("shrink", "--from-sweep", str(tmp_path / "sw"), failing.split("-")[0])
    assert rc == 0 and f"from sweep case {failing}" in text and "--plant rope_pos_plus_1" in text
    assert "L03.q (own)" in text and "5 positions" in text and "1 position (" in text, text
    rc, text = _run("shrink", "--from-sweep", str(tmp_path / "sw"), "c9999")
    assert rc == 2


def test_a_port_that_cannot_be_built_on_fewer_layers_is_shrunk_around_them():
    # build_buggy scales layer 2's coefficients: on 1 or 2 layers its factory raises
    rc, text = _run("shrink", "--port", "tests.ports.toy_port:build_buggy", "--no-check-plain")
    assert rc == 0, text
    assert "L02.hpost (own)" in text and "3 layers" in _best(text), text
    assert "of 1 or 2 layers could not be built" in text and "IndexError" in text
