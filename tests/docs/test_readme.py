"""README.md and the docs/ pages it points into, as a user runs them: every python block
executes as written, every shell command names a command and flags that exist (the ladder's and
the bench's flags go through their own parsers and argument checks), and every ladder flag is
documented."""
from tests import paths
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
import importlib

ROOT = paths.ROOT
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
        "bench_decode", os.path.join(ROOT, "tools", "bench", "bench_decode.py"))
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
    here = paths.TESTS
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
        elif argv[:2] == ["python", "tools/bench/bench_decode.py"]:
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


def test_readme_says_why_the_tiny_examples_repeat_one_id():
    import os
    import re
    from reference import V2Config, init_params
    from reference.decode import generate
    readme = open(os.path.join(paths.ROOT,
                               "docs", "python-api.md"), encoding="utf-8").read()
    port_block = readme.index("print(next_id, int(logits.argmax())")
    why = re.search(r"The ids printed here and below repeat \(`0 0 \.\.\.`, `\[42, 42, \.\.\.\]`"
                    r"\) because the tiny model's\s+weights are random, not trained", readme)
    assert why and why.start() > port_block, "docs/python-api.md does not say why the ids repeat"
    assert readme.index("print(generate(params, cfg, [5, 17, 42], 10))") > why.start()
    cfg = V2Config.preset("tiny")          # what the sentence claims, on the README's inputs
    assert generate(init_params(cfg, seed=0, perturbed=True), cfg, [5, 17, 42], 10) == [42] * 10


def test_readme_tools_table_gives_each_tool_an_expected_runtime():
    import os
    import re
    root = paths.ROOT
    readme = open(os.path.join(root, "docs", "design.md"), encoding="utf-8").read()
    row = readme.split("\n## Tools\n", 1)[1].split("\n## ", 1)[0]     # its list of tools
    found = list(re.finditer(r"^- `([\w/-]+\.(?:py|sh))`", row, re.M))
    names = [m.group(1) for m in found]
    tools = os.path.join(root, "tools")
    listed = {os.path.relpath(os.path.join(d, f), tools) for d, _, fs in os.walk(tools)
              for f in fs if f.endswith((".py", ".sh"))} - {os.path.join("bench", "gpu_timing.py"),
                                                            os.path.join("fixtures", "v41_kernel_standins.py")}
    assert listed <= set(names), sorted(listed - set(names))
    for m, nxt in zip(found, found[1:] + [None]):
        segment = row[m.end():nxt.start() if nxt else len(row)]
        assert re.search(r"\d+(?:\.\d+)?(?:–\d+)? ?(?:s|min)\b", segment), (m.group(1), segment)


def test_readme_says_the_shipped_sweep_exits_1_by_design():
    import os
    import re
    from bounded.io import parse_toml
    root = paths.ROOT
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    with open(os.path.join(root, "docs", "sweep-tiny.toml"), "rb") as f:
        planted = [p for p in parse_toml(f.read(), "sweep-tiny.toml")["grid"]["plant"]
                   if p != "none"]
    section = readme.split("## Sweeps", 1)[1].split("\n## ", 1)[0]
    assert planted and all(f"`{p}`" in section for p in planted)
    assert re.search(r"exits 1\s+by design", section) and "first divergent" in section


def test_the_in_process_snippet_prints_its_verdict(capsys):
    import os
    import re
    root = paths.ROOT
    doc = open(os.path.join(root, "docs", "porting.md"), encoding="utf-8").read()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "capture_protocol" in b]
    exec(compile(block, "docs/porting.md", "exec"), {"__name__": "snippet"})
    assert "0 failing (PASS)" in capsys.readouterr().out
