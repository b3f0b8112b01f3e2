"""The project as installed, not as checked out: a non-editable install must carry every file
the code reads at run time (the native step's C sources and header), and its packages must
export the public API the README and docs/python-api.md use."""
from tests import paths
import os
import subprocess
import sys

import pytest

import kernels.native as native

ROOT = paths.ROOT


@pytest.fixture(scope="module")
def installed(installed_copy):
    return installed_copy


def _in(target, *argv, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=600)


def test_install_ships_every_file_the_native_build_reads(installed):
    shipped = installed / "kernels" / "native"
    for path in native.SOURCES + native.HEADERS:
        assert (shipped / os.path.basename(path)).is_file(), path


def test_installed_copy_runs_the_native_ladder(installed, tmp_path):
    # from a directory that is not the checkout, so only the installed copy is importable
    res = _in(installed, "-c", "import kernels.native as n, ladder; print(n.__file__)",
              cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith(str(installed)), res.stderr
    res = _in(installed, "-m", "ladder", "run", "--backend", "native", "--steps", "1",
              "--no-check-plain", cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "(PASS)" in res.stdout


def test_missing_source_file_makes_native_unavailable_with_the_reason(monkeypatch, tmp_path):
    gone = str(tmp_path / "native.h")
    monkeypatch.setattr(native, "HEADERS", [gone] + native.HEADERS[1:])
    # no library loaded yet, so it is built anew (one cached library, or one per fault set)
    monkeypatch.setattr(native, "_libs", {})
    reason = native.unavailable_reason()
    assert reason is not None and gone in reason and "reinstall" in reason
    assert native.available() is False


def test_public_api_from_package_roots():
    from port import CqWeight, V2Batch, V2Model, V2State
    from port.batch import V2Batch as B
    from port.model import V2Model as M
    from reference import V2Config, forward_cached, init_params, read_cact
    from reference.decode import forward_cached as fc
    from ladder import capture_port, capture_reference, compare_ladders, load_rules
    from ladder.engine.compare import compare_ladders as cl
    assert (V2Model, V2Batch, forward_cached, compare_ladders) == (M, B, fc, cl)
    assert all(callable(x) for x in (V2State, CqWeight, V2Config, init_params, read_cact,
                                     capture_port, capture_reference, load_rules))
    # the seed's constant: which Engram gate the port implements (decode.py's, on u)
    assert V2Model.ENGRAM_GATE_SOURCE == "decode.py (_forward_cached), gate on u"


def test_port_does_not_load_the_reference_math():
    # port/ may read only the model's description from reference/ (docs/design.md, Layout)
    code = ("import sys, port; bad = [m for m in ('reference.decode', 'reference.ops', "
            "'reference.architecture', 'reference.heads') if m in sys.modules]; print(bad)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr
