"""README.md and the docs/ pages it points into, as a user runs them: every python block
executes as written, every shell command names a command and flags that exist (the ladder's and
the bench's flags go through their own parsers and argument checks), and every ladder flag is
documented."""
import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys

import pytest

from ladder.cli.main import parser as ladder_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
# the README and every docs page: the examples and the flag tables live in docs/
DOCS = [README] + [open(os.path.join(ROOT, "docs", f), encoding="utf-8").read()
                   for f in sorted(os.listdir(os.path.join(ROOT, "docs"))) if f.endswith(".md")]
TEXT = "\n".join(DOCS)


def _blocks(lang):
    return [b for doc in DOCS for b in re.findall(rf"```{lang}\n(.*?)```", doc, re.S)]


def _commands():
    """Every simple command of every bash block: (argv, files the line redirects into)."""
    for block in _blocks("bash"):
        for line in block.strip().splitlines():
            line = line.split("  #")[0].strip()
            redirected = re.findall(r">\s*(\S+)", line)
            for part in line.split("&&"):
                yield shlex.split(re.sub(r">\s*\S+", "", part)), redirected


def _bench():
    spec = importlib.util.spec_from_file_location(
        "bench_decode", os.path.join(ROOT, "tools", "bench_decode.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _reference_help() -> str:
    from reference.__main__ import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        main(["run", "--help"])
    return buf.getvalue()


def test_python_blocks_run_as_written():
    blocks = _blocks("python")
    assert len(blocks) >= 2
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})


def test_shell_commands_exist_and_their_flags_parse(tmp_path, monkeypatch, pytestconfig):
    from ladder.cli.args import check_model
    from ladder.cli.main import check_command as check
    from reference import V2Config
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:  # no tomllib on 3.10
        section = f.read().split("[project.optional-dependencies]")[1].split("\n[")[0]
    extras = re.findall(r"^(\w+) = \[", section, re.M)
    monkeypatch.chdir(tmp_path)            # nothing the checks touch lands in the checkout
    # ... but the commands run from the repository root, so its committed fixtures resolve
    here = os.path.dirname(os.path.abspath(__file__))
    (tmp_path / os.path.basename(here)).symlink_to(here)
    bench, ref_help, seen = _bench(), None, set()
    for argv, redirected in _commands():
        for f in redirected:
            (tmp_path / f).write_text("{}")
        head = argv[:3]
        if head[:3] == ["python", "-m", "ladder"]:
            args = ladder_parser().parse_args(argv[3:])    # SystemExit fails the test
            check(args)                                     # the CLI's own argument checks
            if args.cmd not in ("rules", "sweep", "points") and not (args.params or args.cact):
                check_model(args, V2Config.preset(args.preset))
            seen.add("ladder")
        elif head[:3] == ["python", "-m", "reference"]:
            ref_help = ref_help or _reference_help()
            flags = [a for a in argv[4:] if a.startswith("--")]
            assert argv[3] == "run" and all(f in ref_help for f in flags), argv
        elif argv[:2] == ["python", "tools/bench_decode.py"]:
            args = bench.parser().parse_args(argv[2:])
            assert bench.check_args(args) is None, argv
        elif argv[0] == "python" and argv[1].startswith("tools/"):
            # any other tool: it exists, and every flag the README gives is in its --help
            res = subprocess.run([sys.executable, os.path.join(ROOT, argv[1]), "--help"],
                                 capture_output=True, text=True, timeout=120,
                                 env=dict(os.environ, PYTHONPATH=ROOT))
            assert res.returncode == 0, (argv, res.stderr[-2000:])
            assert all(f in res.stdout for f in argv[2:] if f.startswith("--")), argv
        elif argv[:3] == ["python", "-m", "pytest"] and any(a.startswith("--ladder-")
                                                            for a in argv):
            # the plugin's usage lines: every flag is one pytest knows here (ValueError else)
            for flag in (a for a in argv[3:] if a.startswith("-")):
                pytestconfig.getoption(flag)
        elif argv[:3] == ["python", "-m", "pytest"]:
            with open(os.path.join(ROOT, ".ci", "run")) as f:
                assert f.read().strip().splitlines()[-1] == " ".join(argv)   # CI runs it
        elif argv[:3] == ["python3", "-m", "venv"] or argv[0] == ".":
            pass                                            # environment setup
        elif argv[0].endswith("pip") and argv[1] == "install":
            for spec in argv[2:]:
                m = re.fullmatch(r"\.\[(\w+)\]", spec)
                if m:
                    assert m.group(1) in extras, spec
        elif argv[0].endswith("/python") and argv[1].startswith("tools/"):
            assert os.path.isfile(os.path.join(ROOT, argv[1])), argv
        else:
            pytest.fail(f"README command {argv} has no check here: add one")
    assert "ladder" in seen


def test_every_ladder_flag_is_documented():
    ap = ladder_parser()
    sub = next(a for a in ap._actions if a.choices and "run" in a.choices)
    for name, p in sub.choices.items():
        for action in p._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt != "--help":
                    assert f"`{opt}" in TEXT or f"{opt} " in TEXT, (name, opt)
