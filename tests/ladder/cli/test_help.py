"""The CLI's own help is the reference (issue 33, item 5): `python -m ladder --help` names
every command, every flag's help shows its default, `--backend triton` says what it is, and
docs/cli.md's flag tables hold exactly the parser's flags, both ways."""
from tests import paths
import argparse
import os
import re

import pytest

from ladder.cli.main import main, parser

ROOT = paths.ROOT


def _subparsers():
    ap = parser()
    return next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction)).choices


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit):
        main(argv)
    return capsys.readouterr().out


def _flags(p) -> set:
    """The long (or only) spelling of each flag --help shows."""
    return {max(a.option_strings, key=len) for a in p._actions
            if a.option_strings and a.help != argparse.SUPPRESS
            and not isinstance(a, argparse._HelpAction)}


def test_the_top_help_names_every_command(capsys):
    text = _help(["--help"], capsys)
    intro = text.split("positional arguments")[0]
    for cmd in _subparsers():
        assert re.search(rf"\b{cmd}\b", intro.split("\n\n", 1)[1]), (cmd, intro)  # description
        assert re.search(rf"^    {cmd}\s+\S", text, re.M), cmd                  # help line


@pytest.mark.parametrize("cmd", sorted(_subparsers()))
def test_every_flag_shows_its_default(cmd, capsys):
    text = _help([cmd, "--help"], capsys)
    entries = re.split(r"\n  (?=-)", text.split("options:")[1])[1:]
    required = {max(a.option_strings, key=len) for a in _subparsers()[cmd]._actions
                if a.option_strings and a.required}
    for e in entries:
        flag = max(re.findall(r"--?[\w-]+", e.split("  ")[0]), key=len)
        if flag in ("--help",) or flag in required:
            continue
        assert "default" in e.lower(), (cmd, e)
    assert len(entries) == len(_flags(_subparsers()[cmd])) + 1       # every flag has a help


def test_backend_triton_is_described_as_the_fused_decode_body(capsys):
    text = " ".join(_help(["run", "--help"], capsys).split())
    assert "the fused Triton decode body" in text and "Triton attention (" not in text


def _doc_tables() -> dict:
    doc = open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8").read()
    flags = doc.split("\n## Flags\n", 1)[1].split("\n## ", 1)[0]
    out = {}
    for section in flags.split("\n### ")[1:]:
        title, body = section.split("\n", 1)
        cmds = tuple(c.strip() for c in title.split(","))
        out[cmds] = {re.match(r"\| `(?:-\w, )?(--[\w-]+)", ln).group(1)
                     for ln in body.splitlines() if ln.startswith("| `-")}
    return out


def test_the_docs_flag_tables_hold_the_parsers_flags_both_ways():
    sub = _subparsers()
    tables = _doc_tables()
    assert sorted(c for cmds in tables for c in cmds) == sorted(sub), tables.keys()
    for cmds, documented in tables.items():
        parsed = set().union(*(_flags(sub[c]) for c in cmds))
        assert documented == parsed, (cmds, "only in docs/cli.md:", documented - parsed,
                                      "only in the parser:", parsed - documented)


def test_the_docs_check_fails_on_a_flag_the_parser_lacks(monkeypatch):
    real = open

    def doctored(path, *a, **k):
        f = real(path, *a, **k)
        if str(path).endswith(os.path.join("docs", "cli.md")):
            import io
            text = f.read().replace("| `--per-step` |", "| `--per-stepp` |", 1)
            f.close()
            return io.StringIO(text)
        return f
    monkeypatch.setattr("builtins.open", doctored)
    with pytest.raises(AssertionError, match="per-stepp"):
        test_the_docs_flag_tables_hold_the_parsers_flags_both_ways()
