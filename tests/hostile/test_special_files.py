"""Special files (FIFOs, devices, /proc, directories) and pathological text are refused
before any reader parses them; each reader runs in a child process with a capped address space.
"""
from tests import paths
import json
import os
import resource
import subprocess
import sys
import pytest


ROOT = paths.ROOT


FIXTURES = paths.FIXTURES


FIXTURE = os.path.join(FIXTURES, "v2_forward_vectors")


AS_LIMIT = 2 << 30


# ---------------------------------------------------------------- in a limited child process
_CHILD = r"""
import json, os, sys
from ladder import fixtures
from ladder.rules import load_rules
from reference.cact import read_cact
from reference.params import load_params, load_safetensors
tmp, fx = sys.argv[1], sys.argv[2]
os.mkfifo(os.path.join(tmp, "fifo"))
os.symlink("/dev/zero", os.path.join(tmp, "zero"))
for ext in (".cact", ".safetensors", ".toml", ".json"):
    os.symlink(os.path.join(tmp, "fifo"), os.path.join(tmp, "fifo" + ext))
    os.symlink("/dev/zero", os.path.join(tmp, "zero" + ext))
for kind in ("fifo", "zero"):                      # a fixture stem whose manifest is special
    os.symlink(fx + ".safetensors", os.path.join(tmp, kind + "fx.safetensors"))
    os.symlink(os.path.join(tmp, kind), os.path.join(tmp, kind + "fx.json"))
with open(os.path.join(tmp, "deep.toml"), "w") as f:
    f.write("a" + ".a" * 50000 + " = 1\n")
with open(os.path.join(tmp, "quotes.json"), "w") as f:    # an unterminated string of \"
    f.write('{"rules": "' + '\\"' * 200000)
readers = {".cact": read_cact, ".safetensors": load_params, ".toml": load_rules,
           "st": load_safetensors, "fx": fixtures.load}
cases = [(kind + ext, reader, os.path.join(tmp, kind + ext))
         for kind in ("fifo", "zero") for ext, reader in readers.items() if ext[0] == "."]
cases += [(kind + "st", load_safetensors, os.path.join(tmp, kind + ".safetensors"))
          for kind in ("fifo", "zero")]
cases += [(kind + "fx", fixtures.load, os.path.join(tmp, kind + "fx")) for kind in ("fifo", "zero")]
cases += [("dir.cact", read_cact, tmp), ("deep.toml", load_rules, os.path.join(tmp, "deep.toml")),
          ("quotes.json", load_rules, os.path.join(tmp, "quotes.json"))]
out = {}
for name, reader, path in cases:
    try:
        reader(path)
        out[name] = ["accepted", ""]
    except Exception as e:
        out[name] = [type(e).__name__, str(e)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def special_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("special")

    def limits():
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
        resource.setrlimit(resource.RLIMIT_CPU, (60, 60))

    r = subprocess.run([sys.executable, "-c", _CHILD, str(tmp), FIXTURE], capture_output=True,
                       text=True, timeout=120, preexec_fn=limits, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name, error, what", [
    ("fifo.cact", "CactFormatError", ".cact file is a FIFO"),
    ("fifo.safetensors", "ParamsError", "parameter file is a FIFO"),
    ("fifost", "ParamsError", "safetensors file is a FIFO"),
    ("fifo.toml", "RulesError", "rules file is a FIFO"),
    ("fifofx", "FixtureError", "manifest is a FIFO"),
    ("zero.cact", "CactFormatError", ".cact file is a character device"),
    ("zero.safetensors", "ParamsError", "parameter file is a character device"),
    ("zerost", "ParamsError", "safetensors file is a character device"),
    ("zero.toml", "RulesError", "rules file is a character device"),
    ("zerofx", "FixtureError", "manifest is a character device"),
    ("dir.cact", "CactFormatError", ".cact file is a directory"),
])
def test_special_files_are_refused_before_reading(special_files, name, error, what):
    got, msg = special_files[name]
    assert got == error and what in msg and "not a regular file" in msg, (got, msg)


def test_deep_dotted_toml_key_is_refused_before_tomllib(special_files):
    got, msg = special_files["deep.toml"]
    assert got == "RulesError" and "50000 dotted levels" in msg and "limit 32" in msg, msg


def test_unterminated_string_of_escaped_quotes_is_refused_in_linear_time(special_files):
    # A pre-scan that retried each escaped quote would need minutes of CPU here and be killed.
    got, msg = special_files["quotes.json"]
    assert got == "RulesError" and "malformed JSON" in msg and "Unterminated string" in msg, msg
