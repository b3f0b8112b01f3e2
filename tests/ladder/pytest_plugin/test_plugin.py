"""The pytest plugin as a port maintainer uses it: installed with the package, a few fixtures in
their own project, failures that name the first divergence, and golden fixtures with
pytest-regressions' --regen semantics (ladder/pytest_plugin/, ladder/pytest_plugin/golden.py)."""
from tests import paths
import os
import subprocess
import sys

import pytest

from ladder.sides.faults import FAULTS
from reference.config import V2Config

ROOT = paths.ROOT
SHORT = "prompt_len=3, steps=2"          # 5 positions: a second or so per check

# The whole test file of a port maintainer's throwaway project.
USER_TESTS = f'''
import pytest

def test_port_matches_the_reference(ladder_check):
    assert ladder_check({SHORT}).passed

@pytest.mark.ladder({SHORT}, seed=3)
def test_other_tokens(ladder_check):
    assert ladder_check().tokens != ladder_check(seed=0).tokens
'''


def _user_pytest(site, project, *flags):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *flags], cwd=project, env=env, capture_output=True, text=True,
                          timeout=600)


def test_a_throwaway_project_passes_against_our_port_and_fails_on_a_planted_fault(
        installed_copy, tmp_path):
    project = tmp_path / "my-port-ci"
    project.mkdir()
    (project / "test_parity.py").write_text(USER_TESTS)
    # the installed copy, not the checkout: the plugin comes in through its entry point
    res = _user_pytest(installed_copy, project, "-n", "2")        # two xdist workers
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "2 passed" in out
    # the session summary adds up what both workers checked
    assert "3 ladder cases in 2 tests" in out and "0 cases failing" in out, out[-2000:]
    fault = "y_minus_bx"
    point, _ = FAULTS[fault].touches(V2Config.preset("tiny"))
    res = _user_pytest(installed_copy, project, "--ladder-plant", fault,
                       "--ladder-out", str(tmp_path / "out"))
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    assert f"first divergence: prefill/{point}" in out, out[-3000:]
    assert "layer verdict: the layer's own error" in out
    assert "2 failed" in out and f"first divergence prefill/{point} (own error)" in out
    archives = list((tmp_path / "out").rglob("obtained.safetensors"))
    reports = list((tmp_path / "out").rglob("ladder.html"))
    assert len(archives) >= 2 and len(reports) >= 2
    assert str(archives[0].parent) in out                # the failure names where it wrote


def test_importing_the_plugin_loads_no_torch():
    code = "import sys, ladder.pytest_plugin; print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "False", res.stderr


def test_the_plugin_is_registered_by_the_entry_point(pytestconfig):
    import ladder.pytest_plugin as plugin
    assert pytestconfig.pluginmanager.get_plugin("ladder") is plugin


@pytest.fixture
def inner(pytester):
    """An inner pytest session in a temporary directory, in this process (fast)."""
    pytester.syspathinsert(paths.ROOT)   # tests.ports.toy_port
    return pytester


def test_a_protocol_port_failure_reads_well(inner):
    inner.makepyfile(test_toy=f'''
def test_toy(ladder_check):
    ladder_check({SHORT})
''')
    res = inner.runpytest("--ladder-port", "tests.ports.toy_port:build_buggy")
    res.assert_outcomes(failed=1)
    text = res.stdout.str()
    assert "ladder parity FAILED: port tests.ports.toy_port.ToyPort vs reference" in text
    assert "first divergence: prefill/L02.hpost (position 0, layer 2)" in text
    assert "layer verdict: the layer's own error" in text and "prefill/L02.x" in text
    for what in ("obtained archive: ", "report: "):
        path = text.split(what, 1)[1].split()[0]
        assert os.path.isfile(path), what
    assert "FAILED test_toy.py::test_toy [port tests.ports.toy_port.ToyPort]: first divergence " \
           "prefill/L02.hpost (own error)" in text


def test_a_clean_protocol_port_passes_and_a_dump_is_judged_too(inner, tmp_path):
    from ladder.cli.main import main
    dump = tmp_path / "toy.safetensors"
    assert main(["dump", "port", "--port", "tests.ports.toy_port:build", "--out", str(dump),
                 "--prompt-len", "3", "--steps", "2"]) == 0
    inner.makepyfile(test_ok=f'''
def test_ok(ladder_check):
    v = ladder_check()
    assert v.passed and len(v.tokens) == 5
''')
    inner.runpytest("--ladder-dump", str(dump)).assert_outcomes(passed=1)
    inner.makepyfile(test_ok=f'''
def test_ok(ladder_check):
    assert ladder_check({SHORT}).passed
''')
    inner.runpytest("--ladder-port", "tests.ports.toy_port:build").assert_outcomes(passed=1)


@pytest.mark.parametrize("source,needle", [
    ("@pytest.mark.ladder(prompt=3)\ndef test_m(ladder_check):\n    ladder_check()",
     "unknown key 'prompt'; allowed: tokens, prompt_len"),
    ("@pytest.mark.ladder(steps='2')\ndef test_m(ladder_check):\n    ladder_check()",
     "steps='2' is not one-token decode steps"),
    ("@pytest.mark.ladder(3)\ndef test_m(ladder_check):\n    ladder_check()",
     "takes keywords only"),
    ("def test_m(ladder_check):\n    ladder_check(stepz=2)", "unknown key 'stepz'"),
])
def test_a_wrong_marker_or_check_key_is_an_error_naming_it(inner, source, needle):
    inner.makepyfile(test_m="import pytest\n" + source + "\n")
    res = inner.runpytest()
    assert res.ret != 0
    assert needle in res.stdout.str()


GOLDEN = f'''
import pytest

@pytest.mark.ladder({SHORT})
def test_a(ladder_fixture):
    ladder_fixture("golden_a")

def test_b(ladder_fixture):
    ladder_fixture("golden_b", {SHORT}, seed=5)
'''


def _stat(path):
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, open(path, "rb").read()


def test_golden_fixtures_follow_pytest_regressions(inner):
    inner.makepyfile(test_gold=GOLDEN)
    a = inner.path / "test_gold" / "golden_a.safetensors"
    b = inner.path / "test_gold" / "golden_b.safetensors"
    # 1. no stored file: written from the run, and the test fails so it is seen
    res = inner.runpytest()
    res.assert_outcomes(failed=2)
    assert "no stored fixture; wrote" in res.stdout.str() and a.is_file() and b.is_file()
    assert f"golden fixture created: {a} (test_gold.py::test_a)" in res.stdout.str()
    before = _stat(a)
    # 2. stored and equal: pass, nothing rewritten (--ladder-regen leaves passing ones alone)
    inner.runpytest().assert_outcomes(passed=2)
    inner.runpytest("--ladder-regen").assert_outcomes(passed=2)
    assert _stat(a) == before
    # 3. a bug: fails against the golden file, naming the first divergence; file untouched
    res = inner.runpytest("--ladder-plant", "hpost_one")
    res.assert_outcomes(failed=2)
    text = res.stdout.str()
    assert "does not match" in text and "--ladder-regen rewrites it" in text
    assert "vs fixture golden_a.safetensors" in text and "first divergence: prefill/L00.hpost" \
        in text
    assert _stat(a) == before
    # 4. --ladder-regen rewrites the failing ones, and they fail
    res = inner.runpytest("--ladder-plant", "hpost_one", "--ladder-regen")
    res.assert_outcomes(failed=2)
    assert "regenerated" in res.stdout.str() and _stat(a)[2] != before[2]
    assert f"golden fixture rewritten: {a}" in res.stdout.str()
    inner.runpytest("--ladder-plant", "hpost_one").assert_outcomes(passed=2)  # it is the bug's
    res = inner.runpytest()                            # so the clean port now differs from it
    res.assert_outcomes(failed=2)
    # ... and the stale file, not the port, is blamed (issue 34): the stored values are held
    # to the reference recomputed on their schedule
    text = res.stdout.str()
    assert "the stored golden file golden_a.safetensors disagrees with the reference at " \
           "prefill/L00.hpost" in text and "regenerate it (--ladder-regen)" in text
    assert "the port matches the recomputed reference at every point" in text
    assert "inherited" not in text and "own error" not in text
    assert "[fixture golden_a]: the stored golden file disagrees with the reference at " \
           "prefill/L00.hpost: regenerate it" in text             # the session summary
    # 5. --ladder-regen-all rewrites every one, and they pass; then the clean run passes
    inner.runpytest("--ladder-regen-all").assert_outcomes(passed=2)
    assert _stat(a)[2] == before[2]                     # the clean values again, bit for bit
    after = _stat(b)
    inner.runpytest("--ladder-regen-all").assert_outcomes(passed=2)
    assert _stat(b)[0] != after[0] and _stat(b)[2] == after[2]    # rewritten, same bytes
    inner.runpytest().assert_outcomes(passed=2)


def test_a_golden_file_of_another_schedule_or_garbage_fails_and_regen_fixes_it(inner):
    inner.makepyfile(test_gold=GOLDEN)
    inner.runpytest("--ladder-regen-all").assert_outcomes(passed=2)
    res = inner.runpytest("--ladder-weights", "cq")       # another model: not compared
    res.assert_outcomes(failed=2)
    assert "was recorded on parameters" in res.stdout.str() and "cq weights" in \
        res.stdout.str()
    inner.makepyfile(test_gold=GOLDEN.replace("seed=5", "seed=6"))
    res = inner.runpytest()
    res.assert_outcomes(passed=1, failed=1)
    assert "holds other tokens (first difference at position" in res.stdout.str()
    (inner.path / "test_gold" / "golden_a.safetensors").write_bytes(b"\x00" * 64)
    res = inner.runpytest("--ladder-regen")
    res.assert_outcomes(failed=2)
    assert "cannot be read" in res.stdout.str()
    inner.runpytest().assert_outcomes(passed=2)


def test_a_bad_fixture_name_is_refused(inner):
    inner.makepyfile(test_n="def test_n(ladder_fixture):\n    ladder_fixture('../escape')\n")
    res = inner.runpytest()
    res.assert_outcomes(failed=1)
    assert "a name of letters, digits" in res.stdout.str()
    assert not (inner.path.parent / "escape.safetensors").exists()


def test_the_readme_example_runs_and_prints_the_summary_it_shows(inner):
    import re
    # the plugin's page (the README points there): its example suite and its sample summary
    section = open(os.path.join(ROOT, "docs", "pytest.md"), encoding="utf-8").read()
    code = next(b for b in re.findall(r"```python\n(.*?)```", section, re.S)
                if b.startswith("# test_parity.py"))
    shown = re.search(r"```\n(=+ needle-parity ladder =+\n.*?)```", section, re.S).group(1)
    inner.makepyfile(test_parity=code)
    first = inner.runpytest()
    first.assert_outcomes(passed=1, failed=1)               # the golden file is written
    assert "golden fixture created: " in first.stdout.str()
    second = inner.runpytest()
    second.assert_outcomes(passed=2)
    # the worst fraction and its point follow the machine's rounding and thread count; the
    # counts and the form are what the schedules fix
    worst = re.compile(r"worst fraction of allowance: (\d+\.\d{3}) at "
                       r"(prefill|decode\d\d)/L\d\d\.\w+ \(test_parity\.py::\w+\)")
    for line in shown.strip().splitlines():
        if line.startswith("worst fraction of allowance:"):
            assert worst.fullmatch(line), line                  # the page's own sample
            got = [m for m in map(worst.fullmatch, second.stdout.lines) if m]
            assert len(got) == 1, second.stdout.str()
            assert 0.0 < float(got[0].group(1)) < 1.0           # both cases pass
        else:
            assert line in second.stdout.lines, line


@pytest.mark.parametrize("flags,needle", [
    (["--ladder-port", "tests.ports.toy_port:build", "--ladder-plant", "hpost_one"],
     "--ladder-plant hpost_one plants a bug in our port"),
    (["--ladder-plant", "no_such_fault"], "--ladder-plant 'no_such_fault': unknown; known: "),
    (["--ladder-regen", "--ladder-regen-all"], "--ladder-regen and --ladder-regen-all"),
    (["--ladder-plant", ""], "--ladder-plant '': empty"),            # issue 32: not "no fault"
    (["--ladder-port", " "], "--ladder-port ' ': empty"),
])
def test_flags_that_contradict_or_name_nothing_are_usage_errors(inner, flags, needle):
    inner.makepyfile(test_u=f"def test_u(ladder_check):\n    ladder_check({SHORT})\n")
    res = inner.runpytest(*flags)
    assert res.ret == pytest.ExitCode.USAGE_ERROR, res.ret   # refused before any test runs
    assert needle in res.stdout.str() + res.stderr.str()


@pytest.mark.parametrize("spec,needle", [
    ("no_such_module:build", "--ladder-port no_such_module:build: cannot import "
                             "'no_such_module'"),
    ("myport:biuld", "--ladder-port myport:biuld: module 'myport' has no 'biuld'"),
    ("myport", "--ladder-port 'myport': give module:factory"),
])
def test_a_port_spec_with_a_typo_is_a_usage_error_before_any_test_runs(inner, spec, needle):
    inner.makepyfile(myport="def build(params, cfg):\n    raise SystemExit('never called')\n",
                     test_u=f"def test_u(ladder_check):\n    ladder_check({SHORT})\n")
    res = inner.runpytest("--ladder-port", spec)
    assert res.ret == pytest.ExitCode.USAGE_ERROR, res.ret
    assert needle in res.stdout.str() + res.stderr.str()
    assert "Traceback" not in res.stdout.str() + res.stderr.str()


def test_a_port_beside_the_tests_is_found_when_checking_the_spec(inner):
    # the module lives in a test folder that pytest puts on sys.path only as it collects
    sub = inner.mkdir("sub")
    (sub / "sideport.py").write_text("def build(params, cfg):\n    return None\n")
    (sub / "test_s.py").write_text("def test_s(ladder_port):\n    pass\n")
    res = inner.runpytest("sub", "--ladder-port", "sideport:build")
    assert res.ret != pytest.ExitCode.USAGE_ERROR, res.stdout.str()
    # the spec resolves; the object it builds then lacks the protocol, named in the test
    res.assert_outcomes(errors=1)
    assert "lacks make_state()" in res.stdout.str()


@pytest.mark.parametrize("call,needle", [
    ("ladder_check(rules=5)", "rules=5 is not tolerance rules"),
    ("ladder_check(tokens=['a', 'b'])", "tokens=['a', 'b'] is not token ids"),
    ("ladder_check(tokens=[1.5, 2.5])", "tokens=[1.5, 2.5] is not token ids"),
    ("ladder_check(tokens=[])", "tokens=[] is not token ids"),
    ("ladder_check(window=-3)", "window=-3 is not attention window"),
    ("ladder_check(prompt_len=0)", "prompt_len=0 is not prompt positions"),
    ("ladder_fixture(5)", "ladder_fixture(5): a name of letters"),
    ("ladder_fixture('g', stpes=2)", "ladder_fixture: unknown key 'stpes'"),
])
def test_wrong_values_are_refused_naming_them(inner, call, needle):
    inner.makepyfile(test_v=f"def test_v(ladder_check, ladder_fixture):\n    {call}\n")
    res = inner.runpytest()
    res.assert_outcomes(failed=1)
    assert needle in res.stdout.str()
    assert not (inner.path / "test_v").exists()               # nothing was written


def test_a_call_overrides_the_marker_and_a_recording_may_have_a_colon_in_its_name(inner,
                                                                                   tmp_path):
    from ladder.cli.main import main
    dump = tmp_path / "run:1.safetensors"
    assert main(["dump", "torch", "--out", str(dump), "--prompt-len", "3", "--steps", "1"]) == 0
    inner.makepyfile(test_c=f'''
import pytest

@pytest.mark.ladder(steps=9)
def test_c(ladder_check):
    assert len(ladder_check(tokens=[1, 2, 3, 4], prompt_len=2).tokens) == 4
''')
    inner.runpytest().assert_outcomes(passed=1)
    inner.makepyfile(test_c="def test_c(ladder_check):\n    assert ladder_check().passed\n")
    inner.runpytest("--ladder-dump", str(dump)).assert_outcomes(passed=1)


def test_a_golden_path_that_is_no_regular_file_is_never_replaced(inner):
    inner.makepyfile(test_d=f"def test_d(ladder_fixture):\n    ladder_fixture('g', {SHORT})\n")
    (inner.path / "test_d" / "g.safetensors").mkdir(parents=True)
    for flags in ((), ("--ladder-regen-all",)):
        res = inner.runpytest(*flags)
        res.assert_outcomes(failed=1)
        assert "g.safetensors is a directory; golden fixtures are regular files" in \
            res.stdout.str()
        assert (inner.path / "test_d" / "g.safetensors").is_dir()


def test_the_summary_follows_the_outcome_and_says_why_nothing_was_compared(inner):
    inner.makepyfile(test_s=GOLDEN)
    inner.runpytest("--ladder-regen-all").assert_outcomes(passed=2)
    # a bug, every file rewritten: the tests pass, so the summary counts no failing case
    res = inner.runpytest("--ladder-plant", "hpost_one", "--ladder-regen-all")
    res.assert_outcomes(passed=2)
    text = res.stdout.str()
    assert "0 cases failing" in text and "FAILED" not in text
    assert text.count("golden fixture rewritten: ") == 2
    # a stored file of another model: no comparison, and the summary says why
    res = inner.runpytest("--ladder-seed", "1")
    res.assert_outcomes(failed=2)
    assert "FAILED test_s.py::test_a [fixture golden_a]: was recorded on parameters" in \
        res.stdout.str()


def test_a_golden_manifest_field_of_the_wrong_type_reads_as_unreadable(inner):
    from ladder.sides.judge import ModelUnderTest, capture, save_trace
    inner.makepyfile(test_w=f"def test_w(ladder_fixture):\n    ladder_fixture('g', {SHORT})\n")
    model = ModelUnderTest.build()
    cap = capture(model.our_port(), model, prompt_len=3, steps=2)
    path = inner.path / "test_w" / "g.safetensors"
    save_trace(cap, model, path)
    inner.runpytest().assert_outcomes(passed=1)
    cap.obtained.save(path, producer={}, geometry=cap.obtained.meta.get("geometry") or
                      __import__("ladder.model.geometry", fromlist=["x"]).geometry_of(model.cfg),
                      kv_window=cap.window, weights={"params_sha256": 12345},
                      prompt_len=cap.prompt_len)
    res = inner.runpytest()
    res.assert_outcomes(failed=1)
    assert "cannot be read (weights.params_sha256 is int, not a string)" in res.stdout.str()


def test_two_writers_of_one_archive_never_share_a_temporary_file(tmp_path, monkeypatch):
    from ladder.engine import archive
    from ladder.sides.judge import ModelUnderTest, capture, save_trace
    model = ModelUnderTest.build()
    cap = capture(model.our_port(), model, prompt_len=2, steps=0)
    seen, real = [], archive.write_safetensors
    monkeypatch.setattr(archive, "write_safetensors",
                        lambda p, t, metadata=None: (seen.append(p), real(p, t, metadata)))
    target = tmp_path / "g.safetensors"
    save_trace(cap, model, target)
    save_trace(cap, model, target)
    assert len(set(seen)) == 2 and str(target) + ".tmp" not in seen
    assert sorted(os.listdir(tmp_path)) == ["g.safetensors"]


def test_ladder_precision_runs_our_port_at_it_and_judges_against_a_noise_floor(inner):
    inner.makepyfile(test_low=f'''
def test_low(ladder_check):
    v = ladder_check({SHORT})
    assert v.cmp.floor_label.startswith("noise floor (reference at bfloat16")
    assert v.summary()["precision"] == "act=bfloat16,weights=bfloat16,kv=int8"
''')
    res = inner.runpytest("--ladder-precision", "bf16,kv=int8")
    res.assert_outcomes(passed=1)
    assert "1 case judged at a precision against a noise floor: worst" in res.stdout.str()
