"""`python -m ladder`: exit 0 on a clean port, 1 on a divergence, 2 on bad input."""
from tests import paths
import base64
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pandas as pd
import pytest

from ladder.cli.main import main
from ladder.sides.faults import FAULTS, planted
from ladder.engine.rules import DEFAULT_RULES, load_rules
from ladder.engine.trace import schedule
from reference.params import save_params
from tests.captures import FIXTURE, reference_ladder, setup

ROOT = paths.ROOT


def run(*argv):
    lines = []
    rc = main(list(argv), out=lines.append)
    return rc, "\n".join(lines)


def test_run_passes_on_the_tiny_model():
    rc, text = run("run")
    assert rc == 0, text
    assert "tracing changes no bit" in text and "0 failing (PASS)" in text
    coarse = {k.split("/", 1)[1] for k in reference_ladder().keys()
              if k.split("/", 1)[1][4:] in ("hpre", "u", "bx", "y", "hpost", "hres", "x")}
    printed = {line.split()[0] for line in text.splitlines() if line.strip()}
    assert coarse <= printed                          # the table lists every coarse point


def test_run_exits_1_naming_the_first_divergence():
    with planted("attn_gate_skipped"):
        rc, text = run("run", "--no-check-plain")
    assert rc == 1
    assert "first divergence: prefill/L00.attn_out" in text and "python -m ladder locate" in text


def test_locate_prints_bisection_and_injection():
    cfg, _, _, tokens, prompt = setup()
    point, pos = FAULTS["window_off_by_one"].touches(cfg)
    step = next(s.name for s in schedule(tokens, prompt) if pos in s.positions)
    with planted("window_off_by_one"):
        rc, text = run("locate", "--no-check-plain")
    assert rc == 1
    assert f"first divergence: {step}/{point}  (position {pos}, layer 0)" in text
    assert "<- first failing" in text and f"injection at position {pos}" in text
    assert "verdict: the layer's own error" in text
    rc, text = run("locate", "--no-check-plain")
    assert rc == 0 and "no divergence" in text


def test_run_against_the_committed_fixture():
    rc, text = run("run", "--fixture", FIXTURE, "--no-check-plain")
    assert rc == 0, text
    assert "reference: not run; fixture" in text


def test_bad_input_exits_2_naming_the_value(tmp_path, capsys):
    cfg, params = setup()[:2]
    other = tmp_path / "w4.safetensors"
    save_params(other, params, cfg.replace(kv_window=4))
    (tmp_path / "bad.json").write_text('{"rules": [{"pattern": "*", "rtol": -1}]}')
    cases = [
        (["--prompt-len", "0"], "--prompt-len 0: must be >= 1"),
        (["--steps", "-1"], "--steps -1: must be >= 0"),
        (["--steps", "100"], "--prompt-len 6 + --steps 100 = 106 positions: exceeds the "
                             "model's max_seq_len=64"),
        (["--rules", str(tmp_path / "bad.json")], "field rtol=-1"),
        (["--rules", str(tmp_path / "missing.json")], "--rules " + str(tmp_path / "missing.json")
         + ": no such file"),
        (["--params", str(other), "--cact", str(other)], "not both"),
        (["--weights", "bogus"], "--weights bogus: must be dense or cq"),
        (["--fixture", FIXTURE, "--weights", "cq"], "--weights cq quantises the parameters"),
        (["--fixture", FIXTURE, "--params", str(other)], "field kv_window is 8 in the "
                                                         "fixture, 4 in the model"),
        (["--fixture", str(tmp_path / "none")], f"--fixture {tmp_path / 'none'}: no "
                                                f"{tmp_path / 'none'}.json + "),
        (["--window", "9", "--no-check-plain"], "--window 9: must lie in 1..8"),
        (["--device", "nonsense"], "--device nonsense: not a device torch knows"),
    ]
    for argv, msg in cases:
        rc, text = run("run", *argv)
        err = capsys.readouterr().err
        assert rc == 2 and msg in err, (argv, err)
        assert text == "" or argv[0] == "--fixture" and "--params" in argv, (argv, text)


@pytest.mark.parametrize("argv, msg", [
    (["--window", "0"], "--window 0: must lie in 1..8, the port's KV ring"),
    (["--window", "-3"], "--window -3: must be >= 0"),
    (["--window", "99999"], "--window 99999: must lie in 1..8"),
    (["--params", "nowhere.safetensors"], "--params nowhere.safetensors: no such file"),
    (["--cact", "nowhere.cact"], "--cact nowhere.cact: no such file"),
    (["--bits-map", "default=5", "--weights", "cq"], "--bits-map default=5:"),
    (["--seed", str(2 ** 64)], f"--seed {2 ** 64}: outside"),
    (["--backend", "native", "--decode", "graph"], "--backend native runs on the CPU, eagerly"),
])
def test_bad_flags_exit_2_before_any_work(argv, msg, capsys):
    rc, text = run("run", *argv)
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and text == "", (err, text)
    assert err.count("\n") == 1                         # one line, no traceback


def test_a_cact_given_to_params_says_use_cact(tmp_path, capsys):
    from reference.cact import write_cact
    cfg, params = setup()[:2]
    write_cact(tmp_path / "m.cact", params, cfg)
    save_params(tmp_path / "p.safetensors", params, cfg)
    assert run("run", "--params", str(tmp_path / "m.cact"))[0] == 2
    assert f"use --cact {tmp_path / 'm.cact'}" in capsys.readouterr().err
    assert run("run", "--cact", str(tmp_path / "p.safetensors"))[0] == 2
    assert f"use --params {tmp_path / 'p.safetensors'}" in capsys.readouterr().err


def test_no_c_compiler_names_the_torch_backend(monkeypatch, capsys):
    import kernels.native as native
    # no library loaded yet, so it is built anew (one cached library, or one per fault set)
    monkeypatch.setattr(native, "_lib", None, raising=False)
    monkeypatch.setattr(native, "_libs", {}, raising=False)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    rc, text = run("run", "--backend", "native")
    err = capsys.readouterr().err
    assert rc == 2 and text == "" and "use --backend torch" in err and "/nonexistent/cc" in err


def test_fixture_by_name_from_any_directory(monkeypatch, tmp_path, capsys):
    from ladder.sides import fixtures
    monkeypatch.chdir(tmp_path)
    rc, text = run("run", "--fixture", "v2_forward_vectors", "--no-check-plain")
    assert rc == 0 and "fixture " + os.path.abspath(os.path.join(ROOT, FIXTURE)) in text
    assert run("run", "--fixture", "v2_nothing")[0] == 2
    err = capsys.readouterr().err
    assert "--fixture v2_nothing" in err and "fixtures live in the repository's" in err
    monkeypatch.setattr(fixtures, "REPO_FIXTURES", None)       # an installed copy
    assert run("run", "--fixture", "v2_forward_vectors")[0] == 2
    err = capsys.readouterr().err
    assert "this installed copy has no tests/fixtures/" in err and "None" not in err


def test_report_out_checked_before_any_work(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", "/proc/nope"):
        rc, text = run("report", "--out", str(out))
        err = capsys.readouterr().err
        assert rc == 2 and text == "" and f"--out {out}" in err, err


def test_report_png_without_matplotlib_exits_2_and_writes_nothing(monkeypatch, tmp_path,
                                                                   capsys):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    rc, text = run("report", "--out", str(tmp_path / "r"), "--plot", "png")
    err = capsys.readouterr().err
    assert rc == 2 and text == "" and "--plot png needs matplotlib" in err
    assert not (tmp_path / "r").exists()
    rc, text = run("report", "--out", str(tmp_path / "r"), "--no-check-plain", "--steps", "3")
    assert rc == 0 and "figure is SVG" in text                # auto falls back, and says so
    assert "data:image/svg+xml;base64," in (tmp_path / "r" / "ladder.html").read_text()
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == \
        ["ladder.csv", "ladder.html", "ladder.md"]


def test_regen_outside_the_checkout(monkeypatch, tmp_path, capsys):
    from ladder.sides import fixtures
    monkeypatch.chdir(tmp_path)
    rc, text = run("regen", "--check")
    assert rc == 0 and "byte-identical" in text and list(tmp_path.iterdir()) == []
    assert run("regen", "--check", "--out", "fx")[0] == 2
    assert "fx.json does not exist" in capsys.readouterr().err
    monkeypatch.setattr(fixtures, "REPO_FIXTURES", None)       # an installed copy
    assert run("regen")[0] == 2
    assert "give --out STEM" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_python_m_ladder_exit_status():
    p = subprocess.run([sys.executable, "-m", "ladder", "run", "--prompt-len", "0"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "error: --prompt-len 0: must be >= 1" in p.stderr


def test_report_writes_md_csv_and_self_contained_html(tmp_path):
    with planted("residual_gate_skipped"):
        rc, text = run("report", "--out", str(tmp_path), "--no-check-plain", "--plot", "svg")
    assert rc == 1
    csv = pd.read_csv(tmp_path / "ladder.csv")
    assert len(csv) == len(reference_ladder()) and int(csv["first_fail"].sum()) == 1
    assert csv.loc[csv["first_fail"], "point"].item() == "L00.mlp_in"
    page = (tmp_path / "ladder.html").read_text()
    assert page.count('<tr class="first">') == 2      # summary row and full-table row
    assert not re.search(r'(src|href)="(https?:|//)', page) and "<script" not in page
    uri = re.search(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', page).group(1)
    svg = ET.fromstring(base64.b64decode(uri))
    outlines = [e for e in svg.iter() if e.get("class") == "first-divergence"]
    assert len(outlines) == 1                          # the first divergence's cell, marked
    md = (tmp_path / "ladder.md").read_text()
    assert "**DIVERGENCE**: first at `prefill/L00.mlp_in`" in md and "## Locate" in md


def test_rules_command_prints_loadable_rules(tmp_path):
    for fmt in ("toml", "json"):
        rc, text = run("rules", "--format", fmt)
        path = tmp_path / f"r.{fmt}"
        path.write_text(text)
        assert rc == 0 and load_rules(path).rules == DEFAULT_RULES.rules
    json.loads(run("rules", "--format", "json")[1])


def test_regen_check_detects_a_changed_fixture(tmp_path):
    stem = tmp_path / "fx"
    for ext in (".safetensors", ".json"):
        data = open(FIXTURE + ext, "rb").read()
        open(f"{stem}{ext}", "wb").write(data + (b" " if ext == ".json" else b""))
    rc, text = run("regen", "--out", str(stem), "--check")
    assert rc == 1 and "DIFFER" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fx.json", "fx.safetensors"]


def test_progress_bar_draws_on_a_terminal_only():
    import io
    from ladder.cli.progress import Progress
    tty = io.StringIO()
    with Progress(4, "capturing", stream=tty, enabled=True) as pb:
        for _ in range(4):
            pb.update()
    assert "[" + "#" * 28 + "] 4/4" in tty.getvalue() and tty.getvalue().endswith("\n")
    pipe = io.StringIO()                       # not a TTY: CI logs stay clean
    with Progress(4, "capturing", stream=pipe) as pb:
        pb.update(4)
    assert pipe.getvalue() == ""


def test_run_from_a_cact_file_computes_from_the_codes(tmp_path):
    write_cact = pytest.importorskip("reference.cact").write_cact
    if not hasattr(__import__("port.model").model.V2Model, "from_cactfile"):
        pytest.skip("the port has no V2Model.from_cactfile")
    cfg, params = setup()[:2]
    write_cact(tmp_path / "t.cact", params, cfg)
    rc, text = run("run", "--cact", str(tmp_path / "t.cact"), "--steps", "3",
                   "--no-check-plain")
    assert rc == 0, text
    assert "port (torch, eager, cq, cpu, " in text and "0 failing (PASS)" in text


def test_the_help_calls_locates_scan_what_it_is(capsys):
    # docs/design.md: inside a layer the graph branches, so locate scans in forward order;
    # the help once said "bisect"
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "bisect" not in text.lower() and "linear, forward" in text
    assert "bisect" not in open(os.path.join(paths.ROOT, "ladder",
                                             "cli", "main.py"), encoding="utf-8").read()
