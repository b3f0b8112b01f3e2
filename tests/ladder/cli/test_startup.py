"""`python -m ladder --help` and a flag argparse refuses answer without importing torch (or the
ladder's heavy modules): the parser imports nothing that computes (ladder/cli/main.py)."""
from tests import paths
import json
import os
import subprocess
import sys

import pytest

ROOT = paths.ROOT

# `python -m ladder ARGS` in a child, then what it left in sys.modules (on stderr: stdout is
# the help text)
PROBE = """
import json, runpy, sys
sys.argv = ["ladder", *json.loads(sys.argv[1])]
code = 0
try:
    runpy.run_module("ladder", run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "numpy", "reference", "port", "kernels") if m in sys.modules)
print("PROBE " + json.dumps({"code": code, "heavy": heavy}), file=sys.stderr)
"""


def _probe(args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=120)
    line = [x for x in r.stderr.splitlines() if x.startswith("PROBE ")]
    assert line, r.stderr[-2000:]
    return json.loads(line[-1][6:]), r


@pytest.mark.parametrize("args, code", [
    (["--help"], 0), (["run", "--help"], 0), (["compare", "--help"], 0),
    (["sweep", "--help"], 0), (["locate", "--help"], 0), (["shrink", "--help"], 0),
    (["run", "--no-such-flag"], 2), (["no-such-command"], 2), (["run", "--steps", "two"], 2),
    ([], 2),
])
def test_help_and_a_bad_flag_import_no_torch(args, code):
    got, r = _probe(args)
    assert got["code"] == code, r.stderr[-2000:]
    assert got["heavy"] == [], f"{args} imported {got['heavy']}"
    if code == 0:
        assert "usage:" in r.stdout
    else:
        assert "error:" in r.stderr


def test_a_command_still_runs_after_the_deferred_imports(tmp_path):
    """The imports moved into main() still reach every command: `rules` runs and prints."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "ladder", "rules"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0 and "rtol" in r.stdout, r.stderr[-2000:]
