"""`python -m ladder run --model attn_v41` (issue #8): exit 0 with every comparison reported,
exit 1 naming the first divergence, exit 2 on bad input; the default model is unchanged."""
import json
import os
import shutil

import pytest
import torch

from safetensors.torch import load_file, save_file

from ladder.cli.main import main, parser
from ladder.v41.sides import DEFAULT_STEM


def run(*argv):
    lines = []
    rc = main(list(argv), out=lines.append)
    return rc, "\n".join(lines)


def short_fixture(tmp_path, n_calls=6, tensors=None, model_args=None):
    """The committed fixture cut to its first `n_calls` calls (scenario p1: a one-token
    prefill, then decode steps), so a test that needs a whole run pays for 48 layer-calls,
    not 384; `tensors` / `model_args` replace the recordings / the geometry."""
    with open(DEFAULT_STEM + ".json") as f:
        man = json.load(f)
    man["calls"] = man["calls"][:n_calls]
    keys = {c["key"] for c in man["calls"]}
    man["scenarios"] = [dict(s, calls=[k for k in s["calls"] if k in keys])
                        for s in man["scenarios"] if keys & set(s["calls"])]
    if model_args is not None:
        man["model_args"] = model_args
    stem = str(tmp_path / "short")
    with open(stem + ".json", "w") as f:
        json.dump(man, f)
    if tensors is None:
        shutil.copy(DEFAULT_STEM + ".safetensors", stem + ".safetensors")
    else:
        save_file(tensors, stem + ".safetensors")
    return stem, man


def recorded_points(man):
    """How many (call, layer, point) the official recordings hold for the manifest's calls
    (every recorded tensor but the layer input x), read from the fixture file itself."""
    keys = {c["key"] for c in man["calls"]}
    return sum(1 for k in load_file(DEFAULT_STEM + ".safetensors")
               if k.split("/")[0] in keys and not k.endswith("/x"))


def test_run_reports_every_comparison():
    """The plain command reports all three comparisons through the ladder's Comparison, and
    says how the graph one ran: without CUDA the capturable body runs eagerly on the static
    buffers."""
    rc, text = run("run", "--model", "attn_v41")
    assert rc == 0, text
    assert "reference vs official: 3961 points over 48 steps, 0 failing (PASS)" in text
    assert "port (torch, eager, cpu) vs reference: 3961 points over 48 steps, 0 failing " \
           "(PASS)" in text
    assert ("decode graph vs eager: 220/220 capturable layer-steps byte-identical (no CUDA: "
            "capturable body run eagerly on static buffers; capture+replay is "
            "tests/port/v41/test_cuda.py)") in text
    assert "first divergence" not in text
    assert "v41_port/*.topk_idxs" in text            # index points under the exact rule


def test_run_names_the_first_divergence(tmp_path):
    t = load_file(DEFAULT_STEM + ".safetensors")
    t["c005/L3/out"] = t["c005/L3/out"] * 1.1                   # an official output moved
    stem, _ = short_fixture(tmp_path, tensors=t)
    rc, text = run("run", "--model", "attn_v41", "--fixture", stem)
    assert rc == 1
    assert "first divergence: c005/L03.out" in text


def test_bad_input_exits_2(tmp_path, capsys):
    assert run("run", "--model", "attn_v41", "--fixture", str(tmp_path / "none"))[0] == 2
    assert "no such fixture file" in capsys.readouterr().err
    stem = str(tmp_path / "nomanifest")
    with open(stem + ".json", "w") as f:
        json.dump({"calls": []}, f)
    shutil.copy(DEFAULT_STEM + ".safetensors", stem + ".safetensors")
    assert run("run", "--model", "attn_v41", "--fixture", stem)[0] == 2
    assert "lacks field 'model_args'" in capsys.readouterr().err
    assert run("run", "--model", "attn_v41", "--device", "nonsense")[0] == 2
    assert "device='nonsense'" in capsys.readouterr().err


def test_default_model_is_needle_v2():
    assert parser().parse_args(["run"]).model == "needle_v2"
    assert os.path.isfile(DEFAULT_STEM + ".safetensors")


@pytest.mark.parametrize("option", [["--preset", "tiny"], ["--steps", "3"], ["--weights", "cq"],
                                    ["--cact", "x.cact"], ["--decode=graph"], ["--seed", "0"],
                                    ["--window", "4"], ["--no-check-plain"], ["--fine"]])
def test_options_that_do_not_apply_are_refused(option, capsys):
    """A needle v2 option given to a V4.1 run is named and refused, even at its default value
    (before: silently dropped)."""
    assert run("run", "--model", "attn_v41", *option)[0] == 2
    flag = option[0].split("=")[0]
    assert f"error: {flag} does not apply to --model attn_v41" in capsys.readouterr().err
    assert run("locate", "--model", "attn_v41", *option)[0] == 2


def test_rules_file_is_honoured(tmp_path, capsys):
    """--rules replaces V41_RULES: an official output moved by 10% fails the default bound
    (test_run_names_the_first_divergence) and passes a rules file allowing 20%, which the
    report names; a rules file with no V4.1 pattern is bad input naming the point."""
    t = load_file(DEFAULT_STEM + ".safetensors")
    t["c005/L3/out"] = t["c005/L3/out"] * 1.1
    stem, man = short_fixture(tmp_path, tensors=t)
    loose = tmp_path / "loose.json"
    loose.write_text(json.dumps({"rules": [
        {"pattern": "v41_*/*.*_idxs", "rtol": 0.0, "exact": True},
        {"pattern": "v41_official/*", "rtol": 0.2},
        {"pattern": "v41_port/*", "rtol": 0.0}]}))
    rc, text = run("run", "--model", "attn_v41", "--fixture", stem, "--rules", str(loose))
    assert rc == 0, text
    n = recorded_points(man)
    assert f"reference vs official: {n} points over 6 steps, 0 failing (PASS)" in text
    assert "v41_official/*: rtol 2.0e-01" in text
    other = tmp_path / "v2.json"
    other.write_text(json.dumps({"rules": [{"pattern": "port/*", "rtol": 3e-5}]}))
    assert run("run", "--model", "attn_v41", "--rules", str(other), "--fixture", stem)[0] == 2
    assert "no rule covers every v41_official/ point" in capsys.readouterr().err


def _first_recorded(point, layers=range(8)):
    """(call, layer): the first in forward order whose official recording holds `point` (where
    a fault in the code computing it can first show), read from the recordings, not the port."""
    with open(DEFAULT_STEM + ".json") as f:
        man = json.load(f)
    t = load_file(DEFAULT_STEM + ".safetensors")
    return next((c["key"], layer) for c in man["calls"] for layer in layers
                if f"{c['key']}/L{layer}/{point}" in t)


def test_locate_finds_a_fault_planted_in_the_compressor(monkeypatch, tmp_path):
    """The port's ratio-2 compressor pools with its gate weights reversed inside each group:
    locate names the first call where layer 2 completes a group, layer 2, point latent, and
    blames layer 2 (it still fails when re-run from the reference's state); layer 3, which
    only reads the cache layer 2 published, passes from the reference's state (inherited)."""
    import port.v41.compress as C
    monkeypatch.setattr(C, "_softmax_pool",
                        lambda kv, gate: (kv * torch.softmax(gate, dim=1).flip(1)).sum(dim=1))
    call, _ = _first_recorded("latent", layers=[2])      # the ratio-2 kv source
    rc, text = run("locate", "--model", "attn_v41", "--fixture", short_fixture(tmp_path)[0])
    assert rc == 1, text
    assert f"first divergence: {call}/L02.latent" in text
    assert f"verdict: the layer's own error: re-run from the reference's state, L02 still " \
           f"fails at latent in call {call}" in text
    assert "L02 re-run on the reference's state" in text
    layer_line = text.split(f"every layer's out at call {call}")[1].split("\n")[1]
    l03 = layer_line.split("L03 ")[1].split()[0]
    propagated, local = (float(v) for v in l03.split("/"))
    assert local <= 1.0 < propagated, layer_line


def test_locate_finds_a_fault_planted_in_the_indexer(monkeypatch, tmp_path):
    """The port's index query is doubled before its e8m0 fp4 round trip: the first index
    source to score (the first (call, layer) recording an index query) fails at index_q and
    is blamed."""
    import port.v41.compress as C
    rt = C.fp4_e8m0_rt
    monkeypatch.setattr(C, "fp4_e8m0_rt", lambda x, *a: rt(x * 2, *a) if x.dim() == 3
                        else rt(x, *a))
    call, layer = _first_recorded("index_q")
    rc, text = run("locate", "--model", "attn_v41", "--fixture", short_fixture(tmp_path)[0])
    assert rc == 1, text
    assert f"first divergence: {call}/L{layer:02d}.index_q" in text
    assert f"verdict: the layer's own error: re-run from the reference's state, " \
           f"L{layer:02d} still fails at index_q in call {call}" in text


def test_locate_without_divergence(tmp_path):
    rc, text = run("locate", "--model", "attn_v41", "--fixture", short_fixture(tmp_path)[0])
    assert rc == 0, text
    assert "no divergence: every point passes its rule" in text


def test_report_writes_md_csv_html_with_plot(tmp_path):
    stem, man = short_fixture(tmp_path)
    n = recorded_points(man)
    out = tmp_path / "report"
    rc, text = run("report", "--model", "attn_v41", "--out", str(out), "--plot", "svg",
                   "--fixture", stem)
    assert rc == 0, text
    md, csv, html = (out / f"ladder.{e}" for e in ("md", "csv", "html"))
    assert "**PASS**" in md.read_text() and f"reference vs official: {n}/{n}" in md.read_text()
    assert len(csv.read_text().splitlines()) == 1 + n
    official = out / "ladder-official.md"
    assert "# needle-parity ladder: reference vs official" in official.read_text()
    assert len((out / "ladder-official.csv").read_text().splitlines()) == 1 + n
    assert (out / "ladder-official.html").stat().st_size > 0
    page = html.read_text()
    assert 'src="data:image/svg+xml;base64,' in page and "v41_port/*.topk_idxs" in page


def test_exact_rule_kind(tmp_path):
    """The exact rule (index tensors): equal in their own dtype passes, any one difference
    fails at its position, it allows no tolerance, and it survives a TOML round trip."""
    from ladder.engine.rules import V41_RULESET, V41_SIDES, Rule, RulesError, dump_rules, load_rules
    rule = V41_RULESET.for_point("v41_port/L03.topk_idxs")
    assert rule.exact and rule.describe() == "exact (torch.equal)"
    a = torch.tensor([[3, 4, -1], [5, 6, 7]])
    assert rule.error(a, a.clone()) == 0.0
    b = a.clone()
    b[1, 2] = 8
    assert rule.error(a, b) == float("inf")
    assert rule.position_errors(a, b) == [0.0, float("inf")]
    big = torch.tensor([[2 ** 53 + 1]])           # equal as float64, not as integers
    assert rule.error(big, big - 1) == float("inf")
    with pytest.raises(RulesError, match="an exact rule allows nothing"):
        Rule(1e-3, exact=True)
    path = tmp_path / "v41.toml"
    path.write_text(dump_rules(V41_RULESET))
    assert "exact = true" in path.read_text()
    assert load_rules(str(path), V41_SIDES).rules == V41_RULESET.rules


def test_rules_command_prints_the_v41_rules(tmp_path):
    """`ladder rules --model attn_v41` prints V41_RULES as a file --rules reads back unchanged
    (a starting point for a V4.1 rules file); the default is still needle v2's."""
    from ladder.engine.rules import COMPARED_SIDES, DEFAULT_RULES, V41_RULESET, V41_SIDES, load_rules
    for model, want, sides in (("attn_v41", V41_RULESET, V41_SIDES),
                               ("needle_v2", DEFAULT_RULES, COMPARED_SIDES)):
        rc, text = run("rules", "--model", model)
        assert rc == 0
        path = tmp_path / f"{model}.toml"
        path.write_text(text + "\n")
        assert load_rules(str(path), sides).rules == want.rules
