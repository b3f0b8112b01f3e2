"""`python -m ladder run --model attn_v41` (issue #8): exit 0 with every comparison reported,
exit 1 naming the first divergence, exit 2 on bad input; the default model is unchanged."""
import json
import os
import shutil

from safetensors.torch import load_file, save_file

from ladder.cli import main, parser
from ladder.v41 import DEFAULT_STEM


def run(*argv):
    lines = []
    rc = main(list(argv), out=lines.append)
    return rc, "\n".join(lines)


def test_run_reports_every_comparison():
    """The plain command (default --decode eager) reports all three comparisons, and says how
    the graph one ran: without CUDA the capturable body runs eagerly on the static buffers."""
    rc, text = run("run", "--model", "attn_v41")
    assert rc == 0, text
    assert "reference vs official: 3961/3961 points pass" in text
    assert "port (torch, eager, cpu) vs reference: 3961/3961 points pass" in text
    assert ("decode graph vs eager: 220/220 capturable layer-steps byte-identical (no CUDA: "
            "capturable body run eagerly on static buffers; capture+replay is "
            "tests/test_attn_v41_cuda.py)") in text
    assert "first divergence" not in text


def test_run_names_the_first_divergence(tmp_path):
    stem = str(tmp_path / "bent")
    shutil.copy(DEFAULT_STEM + ".json", stem + ".json")
    t = load_file(DEFAULT_STEM + ".safetensors")
    t["c005/L3/out"] = t["c005/L3/out"] * 1.1                   # an official output moved
    save_file(t, stem + ".safetensors")
    rc, text = run("run", "--model", "attn_v41", "--fixture", stem)
    assert rc == 1
    assert "first divergence: c005 L3.out" in text


def test_bad_input_exits_2(tmp_path, capsys):
    assert run("run", "--model", "attn_v41", "--fixture", str(tmp_path / "none"))[0] == 2
    assert "no such fixture file" in capsys.readouterr().err
    stem = str(tmp_path / "nomanifest")
    with open(stem + ".json", "w") as f:
        json.dump({"calls": []}, f)
    shutil.copy(DEFAULT_STEM + ".safetensors", stem + ".safetensors")
    assert run("run", "--model", "attn_v41", "--fixture", stem)[0] == 2
    assert "lacks field 'model_args'" in capsys.readouterr().err
    assert run("locate", "--model", "attn_v41")[0] == 2
    assert "only `run` is implemented" in capsys.readouterr().err
    assert run("run", "--model", "attn_v41", "--device", "nonsense")[0] == 2
    assert "device='nonsense'" in capsys.readouterr().err


def test_default_model_is_needle_v2():
    assert parser().parse_args(["run"]).model == "needle_v2"
    assert os.path.isfile(DEFAULT_STEM + ".safetensors")
