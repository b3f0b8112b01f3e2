"""Golden files judged at what they declare (ladder/pytest_plugin/golden.py, issue 48 item 3):
a golden file declaring another precision than the run's is refused, not judged on the run's
floor, and one whose logits are not numbers fails as unreadable."""
import json

import pytest

# pytester's in-process runs drop the modules they imported afterwards; torch imported
# first inside one and again in the next aborts the process, so it is imported out here
import port.backend  # noqa: F401
from tests import paths

SHORT = "prompt_len=1, steps=1, check_plain=False, locate=False"
GOLDEN = f'''import pytest


@pytest.mark.ladder({SHORT})
def test_g(ladder_fixture):
    ladder_fixture("g")
'''


@pytest.fixture
def golden(pytester):
    """A golden file the test accepts, written by the test's first run."""
    pytester.syspathinsert(paths.ROOT)
    pytester.makepyfile(test_g=GOLDEN)
    pytester.runpytest().assert_outcomes(failed=1)            # created, and seen
    pytester.runpytest().assert_outcomes(passed=1)
    return pytester, pytester.path / "test_g" / "g.safetensors"


def _edit(path, tensors_change=None, producer=None):
    from safetensors import safe_open
    from safetensors.torch import save_file

    from ladder.engine.archive import META_KEY
    with safe_open(str(path), "pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())
    if tensors_change:
        tensors_change(tensors)
    if producer:
        m = json.loads(meta[META_KEY])
        m["producer"].update(producer)
        meta[META_KEY] = json.dumps(m)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=meta)


def test_a_golden_file_records_the_precision_it_was_computed_at(golden):
    from ladder.engine.trace import Ladder
    inner, g = golden
    assert Ladder.load(str(g)).meta["precision"].is_float32
    g.unlink()
    inner.runpytest("--ladder-precision", "bfloat16").assert_outcomes(failed=1)
    assert Ladder.load(str(g)).meta["precision"].short() == "bfloat16"
    inner.runpytest("--ladder-precision", "bfloat16").assert_outcomes(passed=1)


@pytest.mark.parametrize("declared,run", [("float16", ["--ladder-precision", "bfloat16"]),
                                          ("bfloat16", []),
                                          ("float32", ["--ladder-precision", "float16"])])
def test_a_golden_file_declaring_another_precision_fails_naming_both(golden, declared, run):
    inner, g = golden
    if declared != "float32":
        _edit(g, producer={"precision": declared})
    res = inner.runpytest(*run)
    res.assert_outcomes(failed=1)
    text = res.stdout.str()
    assert f"was recorded at {declared}" in text, text[-2000:]
    assert "--ladder-regen rewrites it" in text


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_golden_file_with_logits_that_are_not_numbers_cannot_be_read(golden, value):
    inner, g = golden

    def poison(t):
        t["decode00/logits"] = t["decode00/logits"].index_fill(-1, __import__("torch").tensor(
            [0]), value)
    _edit(g, poison)
    res = inner.runpytest()
    res.assert_outcomes(failed=1)
    text = res.stdout.str()
    assert "cannot be read (decode00/logits holds NaN or Inf" in text, text[-2000:]
    assert "JudgeError" not in text and "Traceback" not in text
