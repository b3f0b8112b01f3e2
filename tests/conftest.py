from tests import paths
import os

import pytest
import torch

# Triton kernels run on CPU through the interpreter (must be set before triton.jit runs).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from hypothesis import settings

from reference.config import V2Config
from reference.params import init_params

torch.set_flush_denormal(True)
# Small tensors: threads only add contention on the 2-core CI machine.
torch.set_num_threads(1)
settings.register_profile("ci", deadline=None, derandomize=True, max_examples=25)
settings.register_profile("dev", deadline=None, max_examples=25)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

FIXTURES = paths.FIXTURES
ROOT = paths.ROOT
# pytester: the plugin's tests run inner pytest sessions (tests/ladder/pytest_plugin/test_plugin.py)
pytest_plugins = ["pytester"]


@pytest.fixture(scope="session")
def installed_copy(tmp_path_factory):
    """`pip install --no-deps --target DIR` of a copy of the source, as a user installs it (pip
    builds in the source tree, so a copy keeps build/ out of the checkout); the DIR."""
    import importlib.util
    import shutil
    import subprocess
    import sys
    base = tmp_path_factory.mktemp("install")
    src, target = base / "src", base / "site"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    for pkg in ("bounded", "reference", "port", "kernels", "ladder"):
        shutil.copytree(os.path.join(ROOT, pkg), src / pkg,
                        ignore=shutil.ignore_patterns("__pycache__"))
    isolation = [] if importlib.util.find_spec("setuptools") is None \
        else ["--no-build-isolation"]
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          *isolation, "--target", str(target), str(src)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return target


@pytest.fixture(scope="session")
def tiny_cfg():
    return V2Config.preset("tiny")


@pytest.fixture(scope="session")
def tiny_params(tiny_cfg):
    return init_params(tiny_cfg, seed=7, perturbed=True)


@pytest.fixture(scope="session")
def v41_fx():
    """The official DeepSeek-V4.1 attention fixture: (manifest, recordings, weights)."""
    from ladder.v41.sides import load_fixture
    return load_fixture()


@pytest.fixture(scope="session")
def v41_ref_run(v41_fx):
    """reference/v41/attn.py driven through every call of the fixture, once per session."""
    from ladder.v41.sides import run_side
    from reference.v41.attn import AttnStackV41
    man, rec, w = v41_fx
    return run_side(AttnStackV41(man["model_args"], w), man, rec)
