"""`python -m ladder`: exit 0 on a clean port, 1 on a divergence, 2 on bad input."""
import base64
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pandas as pd
import pytest

from ladder.cli import main
from ladder.faults import FAULTS, planted
from ladder.rules import DEFAULT_RULES, load_rules
from ladder.trace import schedule
from reference.params import save_params
from ladder_common import FIXTURE, reference_ladder, setup


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
    assert "reference f32 vs fixture" in text


def test_bad_input_exits_2_naming_the_value(tmp_path, capsys):
    cfg, params = setup()[:2]
    other = tmp_path / "w4.safetensors"
    save_params(other, params, cfg.replace(kv_window=4))
    (tmp_path / "bad.json").write_text('{"rules": [{"pattern": "*", "rtol": -1}]}')
    cases = [
        (["--prompt-len", "0"], "--prompt-len 0 must be >= 1"),
        (["--steps", "-1"], "--steps -1 must be >= 0"),
        (["--steps", "100"], "= 106 exceeds max_seq_len=64"),
        (["--rules", str(tmp_path / "bad.json")], "field rtol=-1"),
        (["--rules", str(tmp_path / "missing.json")], "No such file"),
        (["--params", str(other), "--cact", str(other)], "not both"),
        (["--weights", "bogus"], "--weights bogus --device cpu: weights='bogus'"),
        (["--fixture", FIXTURE, "--weights", "cq"], "--weights cq quantises the parameters"),
        (["--fixture", FIXTURE, "--params", str(other)], "field kv_window is 8 in the "
                                                         "fixture, 4 in the model"),
        (["--fixture", str(tmp_path / "none")], "No such file"),
        (["--window", "9", "--no-check-plain"], "kv_window=9 is wider than the ring"),
        (["--device", "nonsense"], "--device nonsense: Expected one of cpu"),
    ]
    for argv, msg in cases:
        rc, _ = run("run", *argv)
        err = capsys.readouterr().err
        assert rc == 2 and msg in err, (argv, err)


def test_python_m_ladder_exit_status():
    p = subprocess.run([sys.executable, "-m", "ladder", "run", "--prompt-len", "0"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "error: --prompt-len 0 must be >= 1" in p.stderr


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
    from ladder.progress import Progress
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
