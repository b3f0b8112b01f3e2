"""tools/hostile/hostile_kinds.py (hostile_inputs.py --kinds): the four generated kinds of issue 48
are deterministic from the seed and every case gets one verdict; the classifier itself is held
to planted outcomes (an escaping exception, a raw exception failing a test, a usage error, a
hostile input accepted, a hang), so that a broken classifier cannot report 0 escapes."""
from tests import paths
import os
import random
import sys
import time

import pytest

sys.path.insert(0, os.path.join(paths.TOOLS, "hostile"))
import hostile_kinds as hk                                            # noqa: E402


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    d = tmp_path_factory.mktemp("bases")
    return {"cli": hk.make_bases("shrink", str(d / "cli")),
            "pytest": hk.make_bases("plugin", str(d / "pytest"))}


def _cases(kind, bases, root, seed, n):
    b = bases["pytest" if kind in ("plugin", "golden") else "cli"]
    gen = hk.generators()[kind]
    out = []
    for i in range(n):
        d = os.path.join(root, f"c{i}")
        os.makedirs(d)
        out.append((d, gen(random.Random(f"{seed}:{kind}:{i}"), b, d)))
    return out


@pytest.mark.parametrize("kind", hk.KINDS)
def test_a_kind_is_the_same_from_the_same_seed(kind, bases, tmp_path):
    seen = []
    for run in ("a", "b"):
        cases = _cases(kind, bases, str(tmp_path / run), 7, 12)
        seen.append([(c.what.replace(d, "D"), c.hostile, c.runner) for d, c in cases])
    assert seen[0] == seen[1]
    assert len({w for w, _, _ in seen[0]}) > 3           # not one case twelve times
    assert any(h for _, h, _ in seen[0])


@pytest.mark.parametrize("kind", hk.KINDS)
def test_a_handful_of_each_kind_run_and_each_gets_one_verdict(kind, bases, tmp_path):
    t0 = time.perf_counter()
    verdicts = [hk.run_case(c, 60)["verdict"] for _, c in _cases(kind, bases, str(tmp_path), 48,
                                                                 5)]
    assert all(v in hk.VERDICTS for v in verdicts), verdicts
    assert time.perf_counter() - t0 < 30


def _cli(argv, hostile=False, **kw):
    return hk.Case("shrink", "planted", argv, hostile, **kw)


def test_the_cli_classifier_flags_what_must_stay_zero():
    def main(argv, out):
        what = argv[0]
        if what == "raise":
            raise KeyError("planted")
        if what == "two-lines":
            print("error: one\nerror: two", file=sys.stderr)
            return 2
        if what == "usage":
            print("usage: x [-h]\nx: error: argument --y: bad", file=sys.stderr)
            raise SystemExit(2)
        if what == "sleep":
            time.sleep(5)
        if what == "refuse":
            print("error: refused", file=sys.stderr)
            return 2
        return 0

    run = lambda case, t=5: hk.run_cli(case, t, main=main)["verdict"]  # noqa: E731
    assert run(_cli(["raise"])) == "traceback"
    assert run(_cli(["two-lines"], True)) == "traceback"
    assert run(_cli(["usage"], True)) == "exit 2 clean"
    assert run(_cli(["refuse"], True)) == "exit 2 clean"
    assert run(_cli(["refuse"], True, must_say="my-map.toml")) == "traceback"
    assert run(_cli(["refuse"], True, after=lambda: "left a file")) == "hostile accepted"
    assert run(_cli(["ok"], True)) == "hostile accepted"
    assert run(_cli(["ok"])) == "accepted legitimately"
    t0 = time.perf_counter()
    assert run(_cli(["sleep"]), 0.5) == "timeout"
    assert time.perf_counter() - t0 < 3


def _pytest_case(tmp_path, body, hostile=False, **kw):
    import kinds_pytest
    d = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    return hk.Case("plugin", "planted", kinds_pytest.project(str(d), body, "test_planted.py"),
                   hostile, runner="pytest", **kw)


def test_the_pytest_classifier_tells_a_raw_exception_from_the_plugins_own_failure(tmp_path):
    run = lambda case, t=30: hk.run_case(case, t)["verdict"]  # noqa: E731
    raw = "def test_x():\n    raise ValueError('planted')\n"
    ours = "import pytest\n\ndef test_x():\n    pytest.fail('ladder_fixture g: x', pytrace=False)\n"
    other = "import pytest\n\ndef test_x():\n    pytest.fail('something else', pytrace=False)\n"
    assert run(_pytest_case(tmp_path, raw)) == "traceback"
    assert run(_pytest_case(tmp_path, raw, True)) == "traceback"
    assert run(_pytest_case(tmp_path, ours)) == "judged failing"
    assert run(_pytest_case(tmp_path, ours, True)) == "hostile accepted"
    golden = {"extra": {"refused_by_failure": True}}
    assert run(_pytest_case(tmp_path, ours, True, **golden)) == "exit 2 clean"
    assert run(_pytest_case(tmp_path, other, True, **golden)) == "hostile accepted"
    assert run(_pytest_case(tmp_path, ours, True, must_say="cannot be read",
                            **golden)) == "hostile accepted"
    assert run(_pytest_case(tmp_path, "def test_x():\n    pass\n", True)) == "hostile accepted"
    case = _pytest_case(tmp_path, "def test_x():\n    pass\n")
    assert run(case) == "accepted legitimately"
    usage = hk.Case("plugin", "planted", ["--ladder-regen", "--ladder-regen-all"] + case.argv,
                    True, runner="pytest")
    assert run(usage) == "exit 2 clean"                    # the plugin's own usage error
    sleep = "import time\n\ndef test_x():\n    time.sleep(5)\n"
    assert run(_pytest_case(tmp_path, sleep), 0.5) == "timeout"
