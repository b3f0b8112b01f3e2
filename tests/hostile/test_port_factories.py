"""A `--port` factory that misbehaves (raises, returns the wrong thing, hangs) is one line
naming the call; --port-timeout needs a port and a positive bound.
"""
import os
import pytest
from ladder.cli.main import main as ladder_main


def _refused(argv, capsys, tmp_path, match):
    before = sorted(os.listdir(tmp_path))
    assert ladder_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert match in err, err
    assert sorted(os.listdir(tmp_path)) == before            # nothing written
    return err


PORTS = {
    "raises": ("def build(params, cfg):\n    raise ZeroDivisionError('boom')\n",
               ":build: its factory raised ZeroDivisionError: boom"),
    "not a port": ("def build(params, cfg):\n    return 7\n",
                   "the object its factory returned lacks make_state()"),
    "sleeps": ("import time\ndef build(params, cfg):\n    time.sleep(30)\n",
               "its factory did not return within 1 s (--port-timeout)"),
    "step sleeps": ("import time\nclass P:\n    def make_state(self):\n        return 0\n"
                    "    def step_traced(self, *a):\n        time.sleep(30)\n"
                    "def build(params, cfg):\n    return P()\n",
                    "step_traced at prefill (token"),
}


@pytest.mark.parametrize("kind", sorted(PORTS))
def test_a_misbehaving_port_is_one_line_naming_the_call(tmp_path, capsys, monkeypatch, kind):
    src, match = PORTS[kind]
    mod = "bad_port_" + kind.replace(" ", "_")          # its own name: imports are cached
    (tmp_path / f"{mod}.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import time
    t0 = time.monotonic()
    _refused(["run", "--port", f"{mod}:build", "--port-timeout", "1", "--steps", "1",
              "--no-check-plain"], capsys, tmp_path, match)
    assert time.monotonic() - t0 < 20                 # the 30 s sleep was cut at 1 s


def test_port_timeout_needs_a_port_and_a_positive_bound(tmp_path, capsys):
    _refused(["run", "--port-timeout", "5"], capsys, tmp_path, "--port-timeout 5: bounds an "
             "in-process --port's calls")
    _refused(["run", "--port", "x:y", "--port-timeout", "0"], capsys, tmp_path,
             "--port-timeout 0.0: seconds in (0, 86400]")
