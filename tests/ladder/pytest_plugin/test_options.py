"""Every --ladder-* value is checked before any test runs (ladder/pytest_plugin/options.py):
a bad one is pytest's usage error (exit 4) naming the flag and the value, never a traceback
repeated in each test (issue 48, item 3)."""
import pytest

# pytester's in-process runs drop the modules they imported afterwards; torch imported
# first inside one and again in the next aborts the process, so it is imported out here
import port.backend  # noqa: F401
from tests import paths

SHORT = "prompt_len=1, steps=1, check_plain=False, locate=False"
TEST = f"def test_u(ladder_check):\n    ladder_check({SHORT})\n"


@pytest.fixture
def inner(pytester):
    pytester.syspathinsert(paths.ROOT)
    pytester.makepyfile(test_u=TEST)
    return pytester


def _refused(inner, *flags) -> str:
    res = inner.runpytest(*flags)
    text = res.stdout.str() + res.stderr.str()
    assert res.ret == pytest.ExitCode.USAGE_ERROR, (res.ret, text[-2000:])
    assert "Traceback" not in text and "PrecisionError" not in text, text[-2000:]
    return text


@pytest.mark.parametrize("spec,needle", [
    ("garbage", "garbage"),
    ("", "--ladder-precision ''"),
    ("float64", "float64"),
    ("bfloat16,kv=float32", "kv"),
    ("kv=int8,bfloat16", "kv=int8,bfloat16"),
    ("bfloat16,extra=1", "extra"),
    ("b" * 300, "300 characters"),
    ("bfloat16\u00e9", "--ladder-precision"),
])
def test_a_precision_the_cli_refuses_is_a_usage_error(inner, spec, needle):
    assert needle in _refused(inner, "--ladder-precision", spec)


def test_a_precision_the_backend_cannot_run_is_a_usage_error(inner):
    text = _refused(inner, "--ladder-backend", "native", "--ladder-precision", "bfloat16")
    assert "does not compute at it on --ladder-backend native" in text
    assert "--ladder-backend torch" in text                  # where it does run


@pytest.mark.parametrize("flags,needle", [
    (["--ladder-device", "meta"], "device type 'meta'"),
    (["--ladder-device", "xla"], "--ladder-device 'xla'"),
    (["--ladder-device", ""], "--ladder-device '': empty"),
    (["--ladder-device", "cuda:99"], "--ladder-device 'cuda:99'"),
    (["--ladder-seed", str(2 ** 64)], "outside -2**63..2**64-1"),
    (["--ladder-seed", "1_0"], "ASCII digits"),
    (["--ladder-seed", "\u0663"], "ASCII digits"),
    (["--ladder-out", "test_u.py"], "--ladder-out test_u.py: exists and is not a directory"),
    (["--ladder-rules", "test_u.py"], "--ladder-rules"),
    (["--ladder-params", "nowhere.safetensors"], "--ladder-params nowhere.safetensors: no "
                                                 "such file"),
    (["--ladder-params", "test_u.py"], "not a readable safetensors file"),
    (["--ladder-cact", "test_u.py"], "not a .cact file"),
    (["--ladder-dump", "nowhere.safetensors"], "no such file"),
    (["--ladder-port", "os:getcwd", "--ladder-dump", "x"], "give one of them"),
    (["--ladder-precision", "bfloat16,weights=cq"], "weights=cq declares CQ codes"),
    (["--ladder-out", "o" * 300], "a name of 300 bytes; this file system takes at most"),
    (["--ladder-port", "os:getcwd"], "called as factory(params, cfg); 'getcwd' takes ()"),
])
def test_bad_values_are_usage_errors_before_any_test_runs(inner, flags, needle):
    assert needle in _refused(inner, *flags)


def test_a_rules_file_that_does_not_parse_is_refused_up_front(inner):
    inner.makefile(".toml", rules="[[rule]]\npattern = 3\n")
    assert "--ladder-rules" in _refused(inner, "--ladder-rules", "rules.toml")


def test_good_values_still_run_the_tests(inner):
    res = inner.runpytest("--ladder-seed", "3", "--ladder-precision", "float32",
                          "--ladder-device", "cpu")
    res.assert_outcomes(passed=1)


@pytest.mark.parametrize("content", [b"", b"\x7b" * 7 + b"\xff" * 17, b"not an archive"])
def test_a_damaged_recording_is_one_usage_error(inner, content):
    inner.path.joinpath("rec.safetensors").write_bytes(content)
    assert "--ladder-dump 'rec.safetensors': cannot be read" in _refused(
        inner, "--ladder-dump", "rec.safetensors")


@pytest.mark.parametrize("flags", [["--ladder-backend", "native"], ["--ladder-decode", "graph"],
                                   ["--ladder-device", "cuda"]])
def test_our_ports_flags_beside_another_port_are_refused(inner, flags):
    text = _refused(inner, "--ladder-port", "tests.ports.toy_port:build", *flags)
    assert f"{flags[0]} '{flags[1]}' configures our port" in text


def test_a_factory_that_raises_fails_its_test_in_one_line(inner):
    inner.makepyfile(broken_port="def build(params, cfg):\n    raise TypeError('no such port')\n")
    res = inner.runpytest("--ladder-port", "broken_port:build")
    res.assert_outcomes(failed=1)
    text = res.stdout.str()
    assert "--ladder-port broken_port:build: its factory raised TypeError: no such port" in text
    assert "UsageError" not in text and "Traceback" not in text and "During handling" \
        not in text
