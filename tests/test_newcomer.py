"""What a newcomer trips on (issue 24, section 3): each test fails without its fix."""
import importlib

from ladder.cli.main import main


def run(*argv):
    lines = []
    rc = main(list(argv), out=lines.append)
    return rc, "\n".join(lines)


def test_ladder_locate_is_the_function_and_its_module_stays_importable():
    mod = importlib.import_module("ladder.engine.locate")
    from ladder import locate
    assert callable(locate) and locate is mod.locate
    import ladder.locate  # noqa: F401  (binding the submodule must not replace the function)
    import ladder
    assert ladder.locate is mod.locate
    from ladder.locate import Location, locate as again       # the flat layout's path
    assert again is mod.locate and Location is mod.Location
    assert importlib.import_module("ladder.locate") is mod      # one module, two paths


def test_fixture_given_by_its_safetensors_file_names_the_right_files(tmp_path, capsys):
    for name in ("x.safetensors", "x.json", "x"):
        assert run("run", "--fixture", str(tmp_path / name)) == (2, "")
        err = capsys.readouterr().err
        assert f"no {tmp_path / 'x'}.json + {tmp_path / 'x'}.safetensors" in err, err
        assert ".safetensors.json" not in err and ".json.json" not in err


def test_header_names_the_true_ring_and_window(monkeypatch):
    rc, text = run("run", "--prompt-len", "4", "--steps", "8", "--window", "5", "--no-check-plain")
    assert rc == 0 and "the ring (8 slots, window 5) wraps at position 8" in text, text
    rc, text = run("run", "--prompt-len", "4", "--steps", "2", "--window", "5", "--no-check-plain")
    assert "6 positions fit in the ring of 8 slots (window 5), so the ring never wraps" in text
    from port.model import V2Model
    from port.state import V2State
    monkeypatch.setattr(V2Model, "make_state",
                        lambda self: V2State(self.cfg, ring=9, window=8, device=self.device))
    rc, text = run("run", "--no-check-plain")
    assert "make_state(): ring 9, window 8" in text
    assert "the ring (9 slots, window 8) wraps at position 9" in text, text


def test_bfloat16_and_float16_values_are_compared_as_float32_and_said_so():
    import torch
    from ladder.engine.compare import compare_ladders
    from ladder.engine.trace import Ladder
    from ladder_common import reference_ladder
    ref = reference_ladder()
    for dt in (torch.bfloat16, torch.float16):
        low = Ladder(ref.steps, {k: v.to(dt) for k, v in ref.values.items()}, "port " + str(dt))
        exact = Ladder(ref.steps, {k: v.to(dt).float() for k, v in ref.values.items()}, "ref")
        cmp = compare_ladders(low, exact)          # a TypeError from numpy without the upcast
        assert cmp.passed and all(r.max_abs == 0 for r in cmp.rows)
        note = f"compared as float32 (a is {str(dt)[6:]}; ulp in float32 units)"
        assert all(note in r.note for r in cmp.rows), cmp.rows[0].note
        assert note in str(cmp.rows[0])
        # still judged: rounding to 16 bits is far outside the port's float32 allowance
        assert not compare_ladders(low, ref).passed


def test_coarse_table_shows_failing_fine_points_and_counts_what_it_hides():
    rc, text = run("run", "--plant", "rope_pos_plus_1", "--no-check-plain")
    assert rc == 1
    rows = [ln.split() for ln in text.splitlines() if ln.startswith(("L0", "embed", "logits"))]
    assert {r[0] for r in rows if r[-2] == "FAIL"} == {"L03.q", "L03.k"}, text
    assert "(coarse ladder, with 2 failing points off it: 54 of 130 points shown; the other 76 " \
           "pass; --fine shows every point, --per-step every step)" in text
    rc, text = run("run", "--plant", "rope_pos_plus_1", "--no-check-plain", "--per-step")
    assert sum(ln.split()[-1] == "FAIL" for ln in text.splitlines() if ln.startswith("L03.")) \
        == 26                       # every failing (step, point) row, though none is coarse
    assert "702 of 1690 rows shown; the other 988 pass; --fine shows every point)" in text
    rc, text = run("run", "--no-check-plain")
    assert rc == 0 and "(coarse ladder: 52 of 130 points shown; the other 78 pass" in text



def test_a_coarse_table_hiding_nothing_says_so_in_english():
    import argparse
    import torch
    from ladder.cli.show import print_table
    from ladder.engine.compare import compare_ladders
    from ladder.engine.rules import DEFAULT_RULES
    from ladder.engine.trace import Ladder, schedule
    steps = schedule([1, 2, 3], 2)
    vals = {f"{s.name}/{p}": torch.ones(len(s.tokens), 4) for s in steps for p in ("L00.u", "L00.x")}
    cmp = compare_ladders(Ladder(steps, vals, "port"), Ladder(steps, vals, "reference"),
                          DEFAULT_RULES)
    lines = []
    print_table(cmp, argparse.Namespace(fine=False, per_step=False), lines.append)
    assert lines[-1] == "(coarse ladder: all 2 points shown)", lines


def _fixture_copy(tmp_path, name="v2_forward_vectors"):
    import shutil
    from ladder_common import FIXTURE
    for ext in (".json", ".safetensors"):
        shutil.copyfile(FIXTURE + ext, tmp_path / f"{name}{ext}")
    return tmp_path / name


def test_regen_refuses_to_overwrite_the_committed_fixture_from_other_inputs(
        monkeypatch, tmp_path, capsys):
    from ladder.sides import fixtures
    stem = _fixture_copy(tmp_path)          # stands in for the checkout's committed fixture
    monkeypatch.setattr(fixtures, "REPO_FIXTURES", str(tmp_path))
    before = [open(f"{stem}{ext}", "rb").read() for ext in (".json", ".safetensors")]
    for flags in (["--seed", "5"], ["--steps", "3"], ["--preset", "tiny", "--window", "4"]):
        assert run("regen", *flags) == (2, "")
        err = capsys.readouterr().err
        assert f"regen {flags[-2]} {flags[-1]}: would overwrite the committed fixture {stem}" \
               in err and "--force" in err, err
    assert [open(f"{stem}{ext}", "rb").read() for ext in (".json", ".safetensors")] == before
    assert run("regen")[0] == 0             # the default inputs rewrite it (the same bytes)
    assert run("regen", "--seed", "5", "--out", str(tmp_path / "other"))[0] == 0
    assert run("regen", "--seed", "5", "--force")[0] == 0
    assert open(f"{stem}.json", "rb").read() != before[0]


def test_regen_check_names_the_first_differing_field_or_tensor(tmp_path):
    import json
    import torch
    from ladder.sides import fixtures
    from reference.params import load_safetensors
    stem = _fixture_copy(tmp_path, "fx")
    m = json.loads(open(f"{stem}.json").read())
    m["seed"] = 7
    open(f"{stem}.json", "w").write(json.dumps(m, indent=1, sort_keys=True) + "\n")
    rc, text = run("regen", "--out", str(stem), "--check")
    assert rc == 1 and "DIFFER from a fresh regeneration: first at manifest field seed: 7 in " \
                       "the file, 0 regenerated" in text, text
    m["seed"] = 0
    tensors, _ = load_safetensors(f"{stem}.safetensors")
    key = "ladder/decode03/L02.x"
    tensors[key] = tensors[key] + torch.finfo(torch.float32).eps
    m["sha256"][key] = fixtures.tensor_sha256(tensors[key])
    fixtures.write(stem, tensors, m)
    rc, text = run("regen", "--out", str(stem), "--check")
    assert rc == 1 and f"first at tensor {key!r} differs" in text, text
    _fixture_copy(tmp_path, "fx")
    open(f"{stem}.json", "a").write(" ")
    rc, text = run("regen", "--out", str(stem), "--check")
    assert rc == 1 and "same manifest fields and tensors, other bytes (the JSON formatting)" \
        in text, text


def test_fixture_stands_in_for_the_reference_which_does_not_run(monkeypatch):
    import ladder.cli.commands
    from ladder_common import FIXTURE

    def live(*a, **k):
        raise AssertionError("the reference ran live beside --fixture")
    monkeypatch.setattr(ladder.cli.commands, "capture_reference", live)
    rc, text = run("run", "--fixture", FIXTURE)
    assert rc == 0, text
    assert f"reference: not run; fixture {FIXTURE} stands in (reference.decode.forward_cached " \
           f"on float64 parameters, rounded to float32, written by " \
           f"tools/gen_v2_forward_parity.py" in text
    assert "tracing changes no bit: port step_traced" in text
    assert "reference not run (fixture), port" in text


def test_a_fixture_not_written_by_the_reference_is_refused(tmp_path, capsys):
    import json
    for key, value in (("generator", "tools/gen_upstream_fixture.py"),
                       ("values", "port (torch, eager) step_traced, float32")):
        stem = _fixture_copy(tmp_path, "fx")
        m = json.loads(open(f"{stem}.json").read())
        m[key] = value
        open(f"{stem}.json", "w").write(json.dumps(m))
        assert run("run", "--fixture", str(stem), "--no-check-plain") == (2, "")
        err = capsys.readouterr().err
        assert f"{stem}.json: field {key}={json.dumps(value)}, needs " in err
        assert "cannot stand in for the reference" in err


def test_report_explains_growth_and_wraps_long_pre_lines():
    import re
    from ladder.engine.compare import compare_ladders
    from ladder.engine.report import html, markdown
    from ladder_common import clean_port_ladder, reference_ladder
    cmp = compare_ladders(clean_port_ladder(), reference_ladder())
    page, text = html(cmp, plot_backend="svg"), markdown(cmp)
    legend = "growth: max|a-b| at this point over max|a-b| at the same point one layer earlier"
    assert legend in page and legend in text
    pre = re.search(r"pre\{([^}]*)\}", page).group(1)
    assert "white-space:pre-wrap" in pre and "overflow-wrap:anywhere" in pre


def test_readme_says_why_the_tiny_examples_repeat_one_id():
    import os
    import re
    from reference import V2Config, init_params
    from reference.decode import generate
    readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "docs", "python-api.md"), encoding="utf-8").read()
    port_block = readme.index("print(next_id, int(logits.argmax())")
    why = re.search(r"The ids printed here and below repeat \(`0 0 \.\.\.`, `\[42, 42, \.\.\.\]`"
                    r"\) because the tiny model's\s+weights are random, not trained", readme)
    assert why and why.start() > port_block, "docs/python-api.md does not say why the ids repeat"
    assert readme.index("print(generate(params, cfg, [5, 17, 42], 10))") > why.start()
    cfg = V2Config.preset("tiny")          # what the sentence claims, on the README's inputs
    assert generate(init_params(cfg, seed=0, perturbed=True), cfg, [5, 17, 42], 10) == [42] * 10


def _tool(name):
    import importlib.util
    import os
    import sys
    tools = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    spec = importlib.util.spec_from_file_location(name, os.path.join(tools, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benches_say_each_stage_on_stderr(capsys):
    import re
    import torch
    threads = torch.get_num_threads()
    try:
        _tool("bench_decode").main(["--preset", "tiny", "--ports", "torch:dense", "--steps", "2"])
        err = capsys.readouterr().err
        for what in ("port 1/1 torch:dense: building",
                     "port 1/1 torch:dense: median of 2 steps at position",
                     "the reference's one-token forward_cached at position"):
            assert re.search(rf"^bench_decode \[ *\d+\.\d s\] {re.escape(what)}", err, re.M), err
        assert _tool("bench_gpu_decode").main(["--preset", "tiny", "--device", "cpu", "--steps",
                                               "2", "--warm", "3", "--configs",
                                               "torch:eager:dense"]) == 0
        err = capsys.readouterr().err
        for what in ("configuration 1/1: torch:eager:dense", "building the dense model",
                     "torch:eager:dense: fast-forward to position 3",
                     "torch:eager:dense: median of 2 steps"):
            assert re.search(rf"^bench_gpu_decode \[ *\d+\.\d s\] {re.escape(what)}", err,
                             re.M), err
    finally:
        torch.set_num_threads(threads)


def test_slow_marker_is_registered_and_on_the_slowest_tests(pytestconfig):
    import os
    assert "slow" in [m.split(":")[0].strip() for m in pytestconfig.getini("markers")]
    import test_bench_gpu_decode
    import test_fused
    import test_ladder_faults
    import test_native
    import test_port
    marks = lambda f: {m.name for m in getattr(f, "pytestmark", [])}
    for f in (test_bench_gpu_decode.test_eight_rows_with_numbers_launches_and_json,   # 63 s
              test_bench_gpu_decode.test_count_launches_json_feeds_the_table,         # 42 s
              test_fused.test_triton_kernels_match_their_twins_in_the_body,           # 23+11 s
              test_native.test_bits_do_not_depend_on_the_vector_width,                # 17 s
              test_port.test_triton_backend_matches_torch_backend,                    # 16 s
              test_ladder_faults.test_triton_faults_on_a_short_schedule):             # 16 s
        assert "slow" in marks(f), f.__name__
    params = next(m for m in test_fused.test_locate_blames_the_fused_layer.pytestmark
                  if m.name == "parametrize").args[1]
    by_id = {p if isinstance(p, str) else p.values[0]:
             set() if isinstance(p, str) else {m.name for m in p.marks} for p in params}
    assert "slow" in by_id["triton"] and "slow" not in by_id["twin"]     # 15 s against 5 s
    readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "README.md"), encoding="utf-8").read()
    assert '`python -m pytest -q -m "not slow"`' in readme


def test_readme_tools_table_gives_each_tool_an_expected_runtime():
    import os
    import re
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    readme = open(os.path.join(root, "docs", "design.md"), encoding="utf-8").read()
    row = readme.split("\n## Tools\n", 1)[1].split("\n## ", 1)[0]     # its list of tools
    found = list(re.finditer(r"^- `([\w-]+\.(?:py|sh))`", row, re.M))
    names = [m.group(1) for m in found]
    listed = {f for f in os.listdir(os.path.join(root, "tools"))
              if f.endswith((".py", ".sh")) and f not in ("gpu_timing.py",
                                                         "v41_kernel_standins.py")}  # helpers
    assert listed <= set(names), sorted(listed - set(names))
    for m, nxt in zip(found, found[1:] + [None]):
        segment = row[m.end():nxt.start() if nxt else len(row)]
        assert re.search(r"\d+(?:\.\d+)?(?:–\d+)? ?(?:s|min)\b", segment), (m.group(1), segment)


# ---- issue 33, item 6: what a newcomer tripped on ----

def test_the_native_steps_first_build_is_announced_on_stderr(tmp_path):
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, NEEDLE_NATIVE_CACHE=str(tmp_path))
    build = [sys.executable, "-c", "from kernels import native; native.build()"]
    first = subprocess.run(build, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "building the native step with " in first.stderr and str(tmp_path) in first.stderr
    again = subprocess.run(build, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "building" not in again.stderr      # cached: silent


def test_the_header_names_the_rules_file_and_the_cq_reference(tmp_path):
    from ladder.engine.rules import DEFAULT_RULES, dump_rules
    rules = tmp_path / "mine.toml"
    rules.write_text(dump_rules(DEFAULT_RULES))
    rc, text = run("run", "--rules", str(rules), "--steps", "1", "--no-check-plain")
    assert rc == 0 and f"rules: {rules} ({len(DEFAULT_RULES.rules)} patterns;" in text, text
    assert "exactly dequantised" not in text
    rc, text = run("run", "--weights", "cq", "--steps", "1", "--no-check-plain")
    assert rc == 0 and "reference: runs on the exactly dequantised weights" in text, text
    assert "rules: " not in text.split("schedule:")[0]


def test_compare_of_a_last_only_dump_counts_the_positions_it_compares(tmp_path):
    out = str(tmp_path / "t.safetensors")
    rc, text = run("dump", "torch", "--out", out, "--last-only")
    assert rc == 0, text
    rc, text = run("compare", out)
    assert rc == 0 and "; compared: 13 last positions of 18 (the last of each step)" in text, text


def test_the_sweep_html_report_renders_its_details_as_html_tables():
    from ladder.sweep.report import html, markdown_html
    md = ("## Worst points across the grid\n\n| case | status |\n|---|---|\n| c0 | fail \\| x |\n"
          "\n## Errors\n\n- c1: boom <b>\n")
    got = markdown_html(md)
    assert got == ("<h3>Worst points across the grid</h3>\n<table><tr><th>case</th><th>status"
                   "</th></tr><tr><td>c0</td><td>fail | x</td></tr></table>\n<h3>Errors</h3>\n"
                   "<ul><li>c1: boom &lt;b&gt;</li></ul>")
    page = html({"name": "t", "grid_file": "g.toml", "grid_sha256": "0" * 64, "shard": "1/1",
                 "cases": 0}, [], [])
    assert "<pre" not in page and "<h3>Worst points across the grid</h3>\n<table>" in page


def test_readme_says_the_shipped_sweep_exits_1_by_design():
    import os
    import re
    from bounded.io import parse_toml
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    doc = open(os.path.join(root, "docs", "porting.md"), encoding="utf-8").read()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "capture_protocol" in b]
    exec(compile(block, "docs/porting.md", "exec"), {"__name__": "snippet"})
    assert "0 failing (PASS)" in capsys.readouterr().out
