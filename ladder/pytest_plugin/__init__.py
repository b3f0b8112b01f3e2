"""needle-parity's pytest plugin: parity checks in anyone's test suite.

Registered through the `pytest11` entry point `ladder` when the package is installed, and idle
until a test asks for one of its fixtures (importing it loads no torch; `-p no:ladder` turns it
off). A port maintainer's whole test file:

    def test_my_port_matches_needle(ladder_check):
        ladder_check()                          # the port of --ladder-port (default: ours)

    @pytest.mark.ladder(prompt_len=4, steps=8, rules="my-rules.toml")
    def test_golden(ladder_fixture):
        ladder_fixture("tiny_decode")           # against tests/<module>/tiny_decode.safetensors

Fixtures:
    ladder_models     session: ModelUnderTest per model spec, built once per process (under
                      pytest-xdist each worker builds its own from the same seeds: the same
                      bits, nothing shared on disk)
    ladder_reference  session: the model of --ladder-preset/--ladder-params/--ladder-cact
    ladder_port       the port under test: --ladder-dump's recording, --ladder-port's factory,
                      or port.V2Model (--ladder-backend, --ladder-weights; --ladder-plant FAULT
                      plants a known bug for the test's duration)
    ladder_check      ladder_check(port=None, **schedule) -> Verdict; fails the test with the
                      first divergence, the layer verdict (own / inherited), a short table, and
                      the paths of the report and of the obtained trace archive it wrote
    ladder_fixture    ladder_fixture(name, port=None, **schedule) -> Verdict; against a stored
                      golden trace archive, pytest-regressions' semantics: a missing file is
                      written and the test fails; --ladder-regen rewrites the ones that fail (and
                      they fail); --ladder-regen-all rewrites all (and they pass)

`@pytest.mark.ladder(**schedule)` sets a test's defaults; its keys are checked (SCHEDULE_KEYS).

Beside this module: golden.py (golden trace archives with pytest-regressions' regen semantics)
and session_summary.py (the end-of-session lines). May import: ladder/sides/ (judge, ports,
faults), ladder/engine/ and below, lazily, so that loading the plugin imports no torch.
The terminal summary counts cases, points, the worst fraction of allowance and each failure's
first divergence (from the reports, so it adds up across xdist workers).
"""
from __future__ import annotations

import json
import os
import re

import pytest

from ladder.pytest_plugin.options import opt as _opt, run_precision, seed

SCHEDULE_KEYS = {
    "tokens": "token ids (a non-empty list of ints); default: seeded ids of prompt_len + steps",
    "prompt_len": "prompt positions fed as the prefill (int >= 1, default 6)",
    "steps": "one-token decode steps after the prompt (int >= 0, default 12)",
    "seed": "seed of the token ids (int; default the model's seed)",
    "window": "attention window (int; default the port's make_state())",
    "rules": "tolerance rules: a .toml/.json path or a RuleSet (default the built-in rules)",
    "check_plain": "prove tracing changes no bit on the port's plain paths (bool, default True)",
    "locate": "on a divergence, split own from inherited error (bool, default True)",
}
_TYPES = {"tokens": (list, tuple), "prompt_len": int, "steps": int, "seed": int,
          "window": int, "check_plain": bool, "locate": bool}
SUMMARY_KEY = "needle-parity"
GOLDEN_KEY = "needle-parity-golden"


class LadderMarkerError(ValueError):
    """A @pytest.mark.ladder or ladder_check argument the plugin refuses (names it)."""


def pytest_addoption(parser):
    g = parser.getgroup("needle-parity", "needle-parity ladder checks")
    g.addoption("--ladder-port", metavar="MODULE:FACTORY", default=None,
                help="the port under test: factory(params, cfg) returning a protocol port "
                     "(ladder/sides/ports.py); default port.V2Model")
    g.addoption("--ladder-dump", metavar="FILE", default=None,
                help="the port under test is this recording (a trace archive or needle-rs stem)")
    g.addoption("--ladder-backend", default="torch", choices=["torch", "native", "triton"],
                help="port.V2Model's backend (default torch)")
    g.addoption("--ladder-weights", default=None, choices=["dense", "cq"],
                help="the weight form (default cq with --ladder-cact, else dense)")
    g.addoption("--ladder-decode", default="eager", choices=["eager", "graph"])
    g.addoption("--ladder-device", default="cpu", help="port.V2Model's device")
    g.addoption("--ladder-precision", metavar="SPEC", default=None,
                help="what the port computes in (bfloat16, float32,kv=int8, ...): our port "
                     "runs at it, and every check is judged against a noise floor "
                     "(docs/precision.md)")
    g.addoption("--ladder-preset", default="tiny", choices=["tiny", "shipped"])
    g.addoption("--ladder-seed", type=seed, default=0, help="parameter init and token seed")
    g.addoption("--ladder-params", metavar="FILE", default=None, help="safetensors parameters")
    g.addoption("--ladder-cact", metavar="FILE", default=None, help="a .cact checkpoint")
    g.addoption("--ladder-rules", metavar="FILE", default=None,
                help="tolerance rules for every check without its own")
    g.addoption("--ladder-plant", metavar="FAULT", default=None,
                help="plant this known bug in port.V2Model (`python -m ladder run "
                     "--list-faults`): the checks must fail")
    g.addoption("--ladder-out", metavar="DIR", default=None,
                help="where failing checks write their report and obtained archive (default "
                     "pytest's temporary directory)")
    g.addoption("--ladder-regen", action="store_true",
                help="rewrite the golden fixtures that fail (those tests still fail)")
    g.addoption("--ladder-regen-all", action="store_true",
                help="rewrite every golden fixture used (those tests pass)")
    parser.addini("ladder_port", "default --ladder-port (MODULE:FACTORY)", default=None)
    parser.addini("ladder_rules", "default --ladder-rules (a rules file)", default=None)
    parser.addini("ladder_params", "default --ladder-params (read beside the ini file when "
                                   "relative)", default=None)
    parser.addini("ladder_cact", "default --ladder-cact (read beside the ini file when "
                                 "relative)", default=None)


def pytest_configure(config):
    config.addinivalue_line("markers", "ladder(**schedule): needle-parity schedule and rules "
                                       "for ladder_check / ladder_fixture; keys: "
                                       + ", ".join(SCHEDULE_KEYS))
    from ladder.pytest_plugin.options import check_options
    check_options(config)       # every --ladder-* value, before any test runs (options.py)


_LOWEST = {"prompt_len": 1, "steps": 0, "window": 0}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_schedule(kw: dict, where: str) -> dict:
    """Schedule keywords validated: an unknown key, a wrong type or a value below its limit
    names itself (None means the default)."""
    for k, v in kw.items():
        if k not in SCHEDULE_KEYS:
            raise LadderMarkerError(f"{where}: unknown key {k!r}; allowed: "
                                    f"{', '.join(SCHEDULE_KEYS)}")
        if v is None:
            continue
        want = _TYPES.get(k)
        bad = want is not None and (not isinstance(v, want) or
                                    (want is int and not _is_int(v)))
        if k == "tokens" and not bad:
            bad = not v or not all(_is_int(t) for t in v)
        if k == "rules" and not isinstance(v, (str, os.PathLike)):
            from ladder.engine.rules import RuleSet
            bad = not isinstance(v, RuleSet)
        if k in _LOWEST and not bad and v < _LOWEST[k]:
            bad = True
        if bad:
            low = f" (>= {_LOWEST[k]})" if k in _LOWEST else ""
            raise LadderMarkerError(f"{where}: {k}={v!r} is not {SCHEDULE_KEYS[k]}{low}")
    return kw


def _marker_schedule(item) -> dict:
    kw = {}
    for m in reversed(list(item.iter_markers("ladder"))):      # the closest marker wins
        if m.args:
            raise LadderMarkerError(f"@pytest.mark.ladder takes keywords only, got "
                                    f"positional {m.args!r}; keys: {', '.join(SCHEDULE_KEYS)}")
        kw.update(check_schedule(dict(m.kwargs), "@pytest.mark.ladder"))
    return kw


def pytest_runtest_setup(item):
    if item.get_closest_marker("ladder") is not None:
        _marker_schedule(item)               # a wrong key errors the test before it runs


class Recording(str):
    """A path the port fixture hands over as a recording, never read as module:factory
    (a file name may hold a ':')."""

    def __fspath__(self):
        return str(self)


class _Models:
    """ModelUnderTest per spec, built on first use and kept for the session."""

    def __init__(self, config):
        self.config, self.built = config, {}

    def get(self, **spec):
        from ladder.sides.judge import ModelUnderTest
        c = self.config
        full = {"preset": _opt(c, "preset"), "seed": _opt(c, "seed"),
                "params": _opt(c, "params"), "cact": _opt(c, "cact"),
                "weights": _opt(c, "weights"), **spec}
        key = json.dumps(full, sort_keys=True, default=str)
        if key not in self.built:
            self.built[key] = ModelUnderTest.build(**full)
        return self.built[key]

    @property
    def default(self):
        return self.get()


@pytest.fixture(scope="session")
def ladder_models(pytestconfig):
    return _Models(pytestconfig)


@pytest.fixture(scope="session")
def ladder_reference(ladder_models):
    return ladder_models.default


@pytest.fixture
def ladder_port(pytestconfig, ladder_reference):
    """The port under test (a recording is returned as the path string judge() reads)."""
    c = pytestconfig
    if _opt(c, "dump"):
        yield Recording(_opt(c, "dump"))
        return
    if _opt(c, "port"):
        from ladder.sides.ports import PortLoadError, build_port
        why = None
        try:
            # the weights the reference runs on (dequantised, for --ladder-weights cq)
            port = build_port(_opt(c, "port"), ladder_reference.ref_params,
                              ladder_reference.cfg)
        except PortLoadError as e:       # the factory ran, and raised: this test fails
            why = str(e).replace("--port", "--ladder-port", 1)
        if why is not None:
            pytest.fail(why, pytrace=False)
        yield port
        return
    fault = _opt(c, "plant")
    if fault is None:
        yield ladder_reference.our_port(_opt(c, "backend"), _opt(c, "decode"), _opt(c, "device"),
                                        precision=run_precision(c))
        return
    from ladder.sides.faults import planted                  # the name was checked in pytest_configure
    from ladder.sides.path_faults import PATH_FAULTS
    path = PATH_FAULTS.get(fault)                # a bug in one plain path (the check finds it)
    with path.plant() if path is not None else planted(fault, _opt(c, "backend")):
        yield ladder_reference.our_port(_opt(c, "backend"), _opt(c, "decode"),
                                        _opt(c, "device"), precision=run_precision(c))


def _out_dir(request, name: str) -> str:
    base = _opt(request.config, "out")
    if base is None:
        base = str(request.getfixturevalue("tmp_path_factory").getbasetemp()
                   / "needle-parity")
    node = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)[-120:]
    return os.path.join(base, node, re.sub(r"[^A-Za-z0-9_.-]+", "_", name))


def _record(request, verdict, kind: str, name: str = "") -> None:
    line = dict(verdict.summary(), kind=kind, name=name, test=request.node.nodeid)
    request.node.user_properties.append((SUMMARY_KEY, line))


def _beside_test(request, rules):
    """A relative rules path of a marker or call is read beside the test file (as golden
    files are), so the suite runs from any directory."""
    if isinstance(rules, str) and not os.path.isabs(rules):
        return os.path.join(os.path.dirname(str(request.node.path)), rules)
    return rules


def _record_golden(request, outcome, name: str) -> None:
    """The summary line of a golden check: the test's outcome (a comparison that failed and
    was regenerated under --ladder-regen-all passes), and why when nothing was compared."""
    v = outcome.verdict
    if v is not None:
        line = dict(v.summary(), passed=not outcome.failed)
    elif outcome.action == "created":
        return                                   # said by the "golden fixture created" line
    else:
        line = {"label": "", "yardstick": "", "passed": not outcome.failed, "points": 0,
                "failing": 0, "worst_fraction": 0.0, "worst_point": None,
                "first_divergence": None, "verdict": None}
    line.update(kind="fixture", name=name, test=request.node.nodeid, why=outcome.why,
                regenerated=outcome.action == "rewritten")
    si = outcome.stand_in
    if si is not None and si.stale:
        # the file disagrees with the reference: no own/inherited verdict on the port
        line.update(verdict=None, first_divergence=None,
                    why=f"the stored golden file disagrees with the reference at "
                        f"{si.stored.first.key}: regenerate it (--ladder-regen)")
    request.node.user_properties.append((SUMMARY_KEY, line))


def _args(request, port, kw: dict, where: str):
    kw = check_schedule(kw, where)
    marked = _marker_schedule(request.node)
    # the call's tokens replace the marker's steps, and its steps the marker's tokens
    for mine, theirs in (("tokens", "steps"), ("steps", "tokens")):
        if kw.get(mine) is not None and theirs not in kw:
            marked.pop(theirs, None)
    merged = {**marked, **kw}
    if merged.get("rules") is not None:
        merged["rules"] = _beside_test(request, merged["rules"])
    elif _opt(request.config, "rules"):
        merged["rules"] = _opt(request.config, "rules")
    if port is None:
        port = request.getfixturevalue("ladder_port")
    return port, merged


@pytest.fixture
def ladder_check(request, ladder_reference):
    """ladder_check(port=None, model=None, **schedule): judged against the reference."""
    from ladder.sides.judge import judge

    def check(port=None, model=None, **kw):
        port, merged = _args(request, port, kw, "ladder_check")
        if _opt(request.config, "precision"):
            merged.setdefault("precision", _opt(request.config, "precision"))
        v = judge(port, model or ladder_reference, **merged)
        _record(request, v, "check")
        if not v.passed:
            v.save_outputs(_out_dir(request, f"check{len(request.node.user_properties)}"))
            pytest.fail(v.message(), pytrace=False)
        return v
    return check


def fixture_path(request, name: str) -> str:
    """pytest-regressions' data directory: beside the test file, in a folder named after
    its module (tests/test_x.py -> tests/test_x/NAME.safetensors)."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", name) \
            or name.startswith("."):
        raise LadderMarkerError(f"ladder_fixture({name!r}): a name of letters, digits, "
                                f"'_', '-', '.' (1..100 characters, not starting with '.')")
    test_file = str(request.node.path)
    return os.path.join(os.path.dirname(test_file),
                        os.path.splitext(os.path.basename(test_file))[0], name + ".safetensors")


@pytest.fixture
def ladder_fixture(request, ladder_reference):
    """ladder_fixture(name, port=None, model=None, **schedule): against a stored trace archive."""
    from ladder.pytest_plugin.golden import check_golden

    def check(name, port=None, model=None, **kw):
        path = fixture_path(request, name)
        port, merged = _args(request, port, kw, "ladder_fixture")
        if _opt(request.config, "precision"):
            merged.setdefault("precision", _opt(request.config, "precision"))
        regen = ("all" if request.config.getoption("--ladder-regen-all") else
                 "failing" if request.config.getoption("--ladder-regen") else None)
        outcome = check_golden(port, model or ladder_reference, path, regen, merged)
        _record_golden(request, outcome, name)
        if outcome.action != "compared":
            request.node.user_properties.append(
                (GOLDEN_KEY, {"test": request.node.nodeid, "path": path,
                              "action": outcome.action}))
        if outcome.failed:
            if outcome.verdict is not None and not outcome.verdict.passed:
                outcome.verdict.save_outputs(_out_dir(request, name))
            pytest.fail(outcome.message(), pytrace=False)
        return outcome.verdict
    return check


def pytest_terminal_summary(terminalreporter):
    checks, written = [], []
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if getattr(rep, "when", None) != "call":
                continue
            for k, v in getattr(rep, "user_properties", ()):
                if k == SUMMARY_KEY:
                    checks.append(v)
                elif k == GOLDEN_KEY:
                    written.append(v)
    if not checks and not written:
        return
    from ladder.pytest_plugin.session_summary import golden_lines, summary_lines
    terminalreporter.write_sep("=", "needle-parity ladder")
    for text in (summary_lines(checks) if checks else []) + golden_lines(written):
        terminalreporter.write_line(text)
