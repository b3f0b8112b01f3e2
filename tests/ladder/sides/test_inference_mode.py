"""Our own sides compute in torch's inference mode, in a command and in a sweep's case
(ladder/sides/model_input.py `computing`). These hold that it changes nothing a case leaves
(its row and its archive, byte for byte) nor what `run` prints, that a protocol port keeps
its caller's mode, and that the tables cached across calls stay normal tensors when code in
inference mode builds them first."""
from __future__ import annotations

from tests import paths
import contextlib
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from ladder.cli.main import main
from ladder.sides import model_input
from ladder.sweep.command import jobs_for, run_case
from ladder.sweep.grid import Case


def _case(i: int, **settings) -> Case:
    base = dict(preset="tiny", seed=5, prompt_len=3, steps=2, no_check_plain=True)
    return Case(i, f"c{i:04d}-test", {**base, **settings})


def _run(case, out):
    row = run_case(jobs_for([case], out, os.getcwd())[0])
    row.pop("timing")
    with open(os.path.join(out, row["archive"]["path"]), "rb") as f:
        return row, f.read()


@pytest.mark.parametrize("settings", [{}, {"plant": "sinkhorn_19"},
                                      {"weights": "cq", "plant": "rope_pos_plus_1"},
                                      {"port_precision": "bfloat16"}],
                         ids=["clean", "sinkhorn_19", "cq-rope", "bf16"])
def test_a_case_leaves_the_same_row_and_archive_bytes_in_either_mode(settings, tmp_path,
                                                                     monkeypatch):
    case = _case(0, **settings)
    fast, fast_bytes = _run(case, str(tmp_path / "inference"))
    monkeypatch.setattr(model_input, "computing", lambda args: contextlib.nullcontext())
    plain, plain_bytes = _run(case, str(tmp_path / "plain"))
    assert fast == plain
    assert fast_bytes == plain_bytes
    assert fast["status"] == ("pass" if "plant" not in settings else "fail")


def test_our_port_computes_in_inference_mode_and_a_protocol_port_in_its_own():
    with model_input.computing(SimpleNamespace(port=None)):
        assert torch.is_inference_mode_enabled()
    with model_input.computing(SimpleNamespace()):
        assert torch.is_inference_mode_enabled()
    with model_input.computing(SimpleNamespace(port="tests.ports.toy_port:build")):
        assert not torch.is_inference_mode_enabled()


@pytest.mark.parametrize("argv", [["run", "--steps", "3"],
                                  ["locate", "--steps", "3", "--plant", "hpost_one"]],
                         ids=["run", "locate-planted"])
def test_a_command_prints_the_same_in_either_mode(argv, monkeypatch):
    def printed():
        lines = []
        code = main(argv, out=lambda *a, **k: lines.append(" ".join(map(str, a))))
        # the timing line ("reference 0.05 s, port 0.10 s, ...") is the one that may differ
        return code, [re.sub(r"\d+\.\d+ s\b", "# s", ln) for ln in lines]
    fast = printed()
    monkeypatch.setattr(model_input, "computing", lambda args: contextlib.nullcontext())
    assert printed() == fast
    assert fast[0] == (0 if argv[0] == "run" else 1)


def test_a_command_runs_in_inference_mode(monkeypatch):
    seen = []
    from ladder.cli import commands
    real = commands.compare_run

    def spy(args, out, *rest):
        seen.append(torch.is_inference_mode_enabled())
        return real(args, out, *rest)
    monkeypatch.setattr(commands, "compare_run", spy)
    assert main(["run", "--steps", "1"], out=lambda *a, **k: None) == 0
    assert seen == [True]


def test_tables_cached_inside_inference_mode_are_normal_tensors():
    from kernels import hadamard_mlp
    from port import cq
    from reference import ops
    ops._rope_tables.cache_clear()
    ops._walsh.cache_clear()
    hadamard_mlp._WALSH.pop((2, "cpu"), None)
    cq._CONSTANTS.pop(("inference-mode test", "cpu"), None)
    with torch.inference_mode():
        made = [*ops.rope_tables(8, 5, 10000.0), ops.walsh_matrix(16),
                cq._const(("inference-mode test",), "cpu", lambda: torch.ones(3) * 2),
                hadamard_mlp.walsh_matrix(2, "cpu")]
        assert torch.ones(1).is_inference()           # the mode is on for new tensors
    assert not any(t.is_inference() for t in made)
    # a later caller outside the mode can save them for backward (an inference tensor refuses)
    w = ops.walsh_matrix(16).clone().requires_grad_()
    (w * ops.walsh_matrix(16)).sum().backward()
    assert torch.equal(w.grad, ops.walsh_matrix(16))


def test_a_protocol_port_runs_in_its_callers_mode_in_run_sweep_and_shrink(tmp_path):
    from tests.ports import mode_probe
    port = "tests.ports.mode_probe:build"
    flags = ["--preset", "tiny", "--prompt-len", "2", "--steps", "1", "--no-check-plain"]
    quiet = dict(out=lambda *a, **k: None)
    mode_probe.MODES.clear()
    assert main(["run", "--port", port, *flags], **quiet) == 1          # the buggy port
    grid = tmp_path / "g.toml"
    grid.write_text(f'[sweep]\nname = "probe"\n[grid]\nseed = [0]\n[fixed]\npreset = "tiny"\n'
                    f'prompt_len = 2\nsteps = 1\nno_check_plain = true\nport = "{port}"\n')
    main(["sweep", str(grid), "--out", str(tmp_path / "sw"), "-j", "1"], **quiet)
    main(["shrink", "--from-sweep", str(tmp_path / "sw"), "c0000", "--max-time", "2",
          "--out", str(tmp_path / "repro")], **quiet)
    assert len(mode_probe.MODES) > 9 and not any(mode_probe.MODES)


SCAN = """
import gc, importlib, pkgutil, sys, torch
from ladder.cli.main import main
names = []
with torch.inference_mode():
    for pkg in ("bounded", "reference", "port", "kernels", "ladder"):
        for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
                names.append(info.name)
for argv in (["run", "--steps", "2"], ["run", "--model", "attn_v41"], ["run", "--weights", "cq",
             "--steps", "2"], ["locate", "--steps", "2", "--plant", "hpost_one"]):
    main(argv, out=lambda *a, **k: None)
gc.collect()
live = [type(o).__name__ + str(tuple(o.shape)) for o in gc.get_objects()
        if isinstance(o, torch.Tensor) and o.is_inference()]
print(len(names), "modules", "LIVE", live)
"""


def test_nothing_built_inside_inference_mode_outlives_it():
    """Every module imported inside the mode, then four commands: no inference tensor is
    left alive afterwards (module constants, caches), so the process goes on as before."""
    root = paths.ROOT
    r = subprocess.run([sys.executable, "-c", SCAN], capture_output=True, text=True,
                       cwd=root, env=dict(os.environ, PYTHONPATH=root), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    line = r.stdout.strip().splitlines()[-1]
    assert int(line.split()[0]) > 100 and line.endswith("LIVE []"), line
