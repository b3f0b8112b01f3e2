"""Text that cannot be printed as it is (lone surrogates, non-UTF-8 file names) is printed
and written escaped, never raised as UnicodeEncodeError.
"""
from tests import paths
import json
import os
from ladder.cli.main import main as ladder_main
from ladder.v41.sides import DEFAULT_STEM as V41_STEM


FIXTURES = paths.FIXTURES


def _v41_stem(tmp_path, edit):
    """A V4.1 fixture stem whose manifest is the committed one after `edit(manifest)`."""
    m = json.load(open(V41_STEM + ".json"))
    edit(m)
    (tmp_path / "v41.json").write_text(json.dumps(m))
    os.symlink(V41_STEM + ".safetensors", tmp_path / "v41.safetensors")
    return str(tmp_path / "v41")


# ---------------------------------------------------------------- 6. text and paths
def test_rule_why_with_a_lone_surrogate_prints_escaped(tmp_path, capsys):
    """pytest's captured stdout is strict UTF-8, as a UTF-8 terminal is."""
    path = tmp_path / "r.json"
    path.write_text('{"rules": {"*": {"rtol": 1e-3, "why": "bad \\ud800 here"}}}')
    assert ladder_main(["rules", "--rules", str(path)]) == 0
    assert 'why = "bad \\ud800 here"' in capsys.readouterr().out


def _stop(*a, **k):
    from ladder.cli.main import LadderInputError
    raise LadderInputError("stopped after the header")


def test_v41_field_with_a_lone_surrogate_prints_escaped(tmp_path, monkeypatch, capsys):
    import ladder.v41.cli
    stem = _v41_stem(tmp_path, lambda m: m["official"].update(repo="deepseek\udc80\ud800"))
    monkeypatch.setattr(ladder.v41.cli, "run_side", _stop)        # the header is the point
    assert ladder_main(["run", "--model", "attn_v41", "--fixture", stem]) == 2
    cap = capsys.readouterr()
    assert "fixture v41 of deepseek\\x80\\ud800 @" in cap.out, cap.out
    assert cap.err == "error: stopped after the header\n"


def test_non_utf8_file_name_prints_escaped(tmp_path, monkeypatch, capsys):
    import ladder.cli.commands
    d = os.fsencode(str(tmp_path))
    stem = os.fsdecode(d + b"/fx\xff")
    for ext in (".json", ".safetensors"):
        os.symlink(os.path.join(FIXTURES, "v2_forward_vectors" + ext), stem + ext)
    monkeypatch.setattr(ladder.cli.commands, "bar", _stop)
    assert ladder_main(["run", "--fixture", stem]) == 2
    assert "vs fixture " + str(tmp_path) + "/fx\\xff" in capsys.readouterr().out


def test_report_text_with_a_lone_surrogate_is_written_escaped(tmp_path):
    from ladder.engine.atomic import write_all
    write_all({tmp_path / "a.md": "why \ud800 \udcff"})
    assert (tmp_path / "a.md").read_text() == "why \\ud800 \\xff"
