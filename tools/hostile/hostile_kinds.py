"""Issue 48's generated kinds for tools/hostile/hostile_inputs.py --kinds: shrink's flags and a
sweep row's `run` string (kinds_cli.py), precision declarations on the CLI, in name maps and in
trace archive manifests (kinds_cli.py), the pytest plugin's options and the golden files it
reads (kinds_pytest.py).

    python tools/hostile/hostile_inputs.py --kinds shrink,precision,plugin,golden --cases 260

Each case is generated from (seed, kind, index) alone, so any one of them can be rebuilt and
rerun. The cases of one kind run in one child process under an address-space and a CPU-time
limit (as --readers does), one after another in process: CLI cases through
`ladder.cli.main.main(argv)` (SystemExit caught), pytest cases through `pytest.main(argv)`,
each under SIGALRM. The child prints one JSON line per case; should it die or hang, the
parent counts the case it was on (a timeout or a crash) and restarts it at the next index.

Verdicts, as --readers counts them: "exit 2 clean" (a refusal: exit 2 and one `error:` line,
argparse's usage included; for pytest, exit 4 with an `ERROR:` line, or for a hostile golden
file a failed test carrying only the plugin's own message), "accepted legitimately", "judged
failing", and the three that must stay 0: "hostile accepted" (a certainly-invalid input not
refused, or a refusal that left files behind), "traceback" (an exception escaping, a raw
exception failing a test, or an exit 2 that is not one clean line) and "timeout".
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
VERDICTS = ("exit 2 clean", "accepted legitimately", "judged failing", "hostile accepted",
            "traceback", "timeout")
BAD = ("hostile accepted", "traceback", "timeout")
KINDS = ("shrink", "precision", "plugin", "golden")
# pytest cases: no cache written, no plugin but ours loaded, each test file its own module
QUIET = ["-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:hypothesispytest",
         "--import-mode=importlib", "-W", "ignore::DeprecationWarning"]


@dataclass
class Case:
    kind: str                        # which generator
    what: str                        # the input, in words (the escape list prints it)
    argv: list                       # ladder's argv, or pytest's
    hostile: bool = False            # certainly invalid: must be refused
    runner: str = "cli"              # "cli": ladder.cli.main.main; "pytest": pytest.main
    must_say: str = ""               # a refusal's text must hold this (e.g. the file's name)
    after: Callable | None = None    # () -> "" or what the run left wrong (checked last)
    quiet_pass: str = ""             # pytest: a pass is hostile unless the output says this
    extra: dict = field(default_factory=dict)


class CaseTimeout(BaseException):
    """Raised by SIGALRM in the case's own process: not an Exception, so that nothing under
    test swallows it as an error of its own."""


@contextlib.contextmanager
def alarm(seconds: float, state: dict):
    def expired(signum, frame):
        state["expired"] = True
        raise CaseTimeout
    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, max(0.1, seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _lines(text: str) -> list:
    return [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("building ")]


def run_cli(case: Case, timeout: float, main=None) -> dict:
    """One CLI case in this process: {"verdict", "last", "reason"}."""
    if main is None:
        from ladder.cli.main import main
    err, state = io.StringIO(), {}
    escaped = None
    try:
        with alarm(timeout, state), contextlib.redirect_stderr(err), \
                contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = main(case.argv, out=lambda *a: None)
            except SystemExit as e:          # argparse, or --help
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except CaseTimeout:
        rc = None
    except BaseException as e:               # noqa: BLE001  anything escaping the CLI
        rc, escaped = None, f"{type(e).__name__}: {str(e)[:200]}"
    text = err.getvalue()
    lines = _lines(text)
    last = lines[-1][:200] if lines else ""
    if state.get("expired"):
        return {"verdict": "timeout", "last": last, "reason": f"past {timeout} s"}
    if escaped:
        return {"verdict": "traceback", "last": escaped, "reason": "exception escaped"}
    return _judge_rc(case, rc, text, lines, last)


def _judge_rc(case, rc, text, lines, last) -> dict:
    said = case.must_say
    if rc == 2:
        one = len(lines) == 1 and lines[0].startswith("error: ")
        usage = bool(lines) and ": error: " in lines[-1]     # argparse: usage, then one line
        if "Traceback" in text or not (one or usage):
            return {"verdict": "traceback", "last": last,
                    "reason": f"exit 2 with {len(lines)} stderr lines"}
        if said and said not in text:
            return {"verdict": "traceback", "last": last,
                    "reason": f"exit 2 but the line does not name {said!r}"}
        return _after(case, {"verdict": "exit 2 clean", "last": last, "reason": ""})
    if rc not in (0, 1):
        return {"verdict": "traceback", "last": last, "reason": f"exit {rc}"}
    if "Traceback" in text:
        return {"verdict": "traceback", "last": last, "reason": f"exit {rc} with a traceback"}
    if case.hostile:
        return {"verdict": "hostile accepted", "last": last, "reason": f"exit {rc}"}
    return _after(case, {"verdict": "accepted legitimately" if rc == 0 else "judged failing",
                         "last": last, "reason": ""})


def _after(case, res: dict) -> dict:
    wrong = case.after() if case.after else ""
    if wrong:
        return {"verdict": "hostile accepted", "last": res["last"], "reason": wrong}
    return res


# ---------------------------------------------------------------- pytest cases
class Watch:
    """A pytest plugin object: what ended each test phase, and collection errors."""

    def __init__(self):
        self.raw, self.failed = [], []

    def pytest_runtest_makereport(self, item, call):
        import pytest
        if call.excinfo is None or call.excinfo.errisinstance(pytest.skip.Exception):
            return None
        if call.excinfo.errisinstance(pytest.fail.Exception):
            self.failed.append(str(call.excinfo.value)[:2000])
        else:
            self.raw.append(f"{call.when}: {call.excinfo.typename}: "
                            f"{str(call.excinfo.value)[:160]}")
        return None

    def pytest_collectreport(self, report):
        if report.failed:
            self.raw.append(f"collect: {str(report.longrepr).strip().splitlines()[-1][:160]}")


def _forget_tests(argv) -> None:
    """Drop the modules imported from the case's directory: under --import-mode=importlib
    every case's test_parity.py is module `test_parity`, and a cached one would run the first
    case's file in every later case."""
    if "--rootdir" not in argv:
        return
    root = os.path.abspath(argv[argv.index("--rootdir") + 1]) + os.sep
    for name, mod in list(sys.modules.items()):
        if os.path.abspath(getattr(mod, "__file__", None) or os.sep).startswith(root):
            del sys.modules[name]


def run_pytest(case: Case, timeout: float) -> dict:
    """One pytest case in this process: {"verdict", "last", "reason"}."""
    import pytest
    watch, state, buf = Watch(), {}, io.StringIO()
    rc = None
    try:
        with alarm(timeout, state), contextlib.redirect_stdout(buf), \
                contextlib.redirect_stderr(buf):
            rc = int(pytest.main([*QUIET, *case.argv], plugins=[watch]))
    except CaseTimeout:
        pass
    except BaseException as e:               # noqa: BLE001  escaped pytest itself
        return {"verdict": "traceback", "last": f"{type(e).__name__}: {str(e)[:160]}",
                "reason": "escaped pytest.main"}
    finally:
        _forget_tests(case.argv)
    text = buf.getvalue()
    lines = _lines(text)
    if state.get("expired"):
        return {"verdict": "timeout", "last": lines[-1][:200] if lines else "",
                "reason": f"past {timeout} s"}
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    if watch.raw:
        return {"verdict": "traceback", "last": watch.raw[0], "reason": f"exit {rc}, "
                f"{len(watch.raw)} raw exceptions"}
    if rc == 4:
        if errors and "Traceback" not in text:
            return _after(case, {"verdict": "exit 2 clean", "last": errors[-1][:200],
                                 "reason": ""})
        return {"verdict": "traceback", "last": lines[-1][:200] if lines else "",
                "reason": "exit 4 without a clean ERROR: line"}
    if rc not in (0, 1):
        bad = [ln for ln in lines if "INTERNALERROR" in ln or "Error" in ln]
        return {"verdict": "traceback", "last": (bad or lines or [""])[-1][:200],
                "reason": f"pytest exit {rc}"}
    said = "\n".join(watch.failed)
    last = (watch.failed[-1].strip().splitlines() or [""])[0][:200] if watch.failed else \
        (lines[-1][:200] if lines else "")
    if rc == 0:
        if case.hostile and not (case.quiet_pass and re.search(case.quiet_pass, text)):
            return {"verdict": "hostile accepted", "last": last, "reason": "passed"}
        return _after(case, {"verdict": "accepted legitimately", "last": last, "reason": ""})
    if case.hostile and case.extra.get("refused_by_failure"):
        ours = watch.failed and all(m.startswith("ladder_fixture ") for m in watch.failed)
        if ours and case.must_say in said:
            return _after(case, {"verdict": "exit 2 clean", "last": last, "reason": ""})
        return {"verdict": "hostile accepted", "last": last,
                "reason": f"failed, but not through {case.must_say or 'the plugin'!r}"}
    if case.hostile:
        return {"verdict": "hostile accepted", "last": last, "reason": "tests ran and failed"}
    return _after(case, {"verdict": "judged failing", "last": last, "reason": ""})


# ---------------------------------------------------------------- the child and the report
def generators() -> dict:
    sys.path.insert(0, HERE)
    import kinds_cli
    import kinds_pytest
    return {"shrink": kinds_cli.shrink_case, "precision": kinds_cli.precision_case,
            "plugin": kinds_pytest.plugin_case, "golden": kinds_pytest.golden_case}


def make_bases(kind: str, d: str) -> dict:
    sys.path.insert(0, HERE)
    import kinds_cli
    import kinds_pytest
    return (kinds_pytest.make_bases if kind in ("plugin", "golden") else kinds_cli.make_bases)(d)


def run_case(case: Case, timeout: float) -> dict:
    return (run_pytest if case.runner == "pytest" else run_cli)(case, timeout)


def cases_of(kind: str, seed: int, start: int, n: int, bases: dict, tmp: str):
    """(index, case directory, Case) for cases start..n-1 of `kind`: each from its own rng."""
    gen = generators()[kind]
    for i in range(start, n):
        d = os.path.join(tmp, f"c{i}")
        os.makedirs(d)
        yield i, d, gen(random.Random(f"{seed}:{kind}:{i}"), bases, d)


def child(kind: str, n: int, seed: int, timeout: float, start: int = 0) -> int:
    """Cases start..n-1 of `kind`, one JSON line each on stdout (flushed: the parent reads
    them as they come, and knows where a dead child stopped)."""
    sys.path[:0] = [ROOT]
    os.chdir(ROOT)                      # `python -m ladder`'s view: tests.ports importable
    real_out = sys.stdout
    with tempfile.TemporaryDirectory() as tmp:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            bases = make_bases(kind, os.path.join(tmp, "bases"))
        for i, d, case in cases_of(kind, seed, start, n, bases, tmp):
            t0 = time.perf_counter()
            print(json.dumps({"start": i, "what": case.what[:160]}), file=real_out, flush=True)
            res = run_case(case, timeout)
            res.update(i=i, what=case.what[:160], seconds=round(time.perf_counter() - t0, 2))
            print(json.dumps(res), file=real_out, flush=True)
            shutil.rmtree(d, ignore_errors=True)
    return 0


def child_limits(max_as: int, cpu: int):
    """A preexec_fn capping a child's address space and CPU seconds (hostile_inputs.py too)."""
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (max_as, max_as))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    return apply


def run_kind(kind: str, n: int, seed: int, timeout: float, max_as: int, script: str) -> list:
    """Every case's result of `kind`, restarting the child past a case that killed it."""
    results, start = [], 0
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", PYTEST_ADDOPTS="")
    while start < n:
        cmd = [sys.executable, script, "--kind-child", kind, "--cases", str(n), "--seed",
               str(seed), "--timeout", str(timeout), "--start", str(start)]
        # stderr to a file: a pipe nobody reads until the end could fill and stall the child
        errf = tempfile.TemporaryFile("w+")
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=errf,
                             text=True, start_new_session=True,
                             preexec_fn=child_limits(max_as, int((n - start) * timeout) + 300))
        lines: queue.Queue = queue.Queue()
        def pump(src=p.stdout, dst=lines):
            for ln in src:
                dst.put(ln)
            dst.put(None)
        threading.Thread(target=pump, daemon=True).start()
        current, wait, nxt = None, 300.0, start    # the bases first, then each case's bound
        while True:
            try:
                ln = lines.get(timeout=wait)
            except queue.Empty:
                os.killpg(p.pid, signal.SIGKILL)
                ln = None
                current = current or {"start": nxt, "what": "(between cases, or the bases)"}
                current["hung"] = True
            if ln is None:
                break
            try:
                msg = json.loads(ln)
            except json.JSONDecodeError:     # something wrote to fd 1 past the redirection
                continue
            if "start" in msg:
                current, wait = msg, timeout + 30
            else:
                results.append(msg)
                current, nxt = None, msg["i"] + 1
        p.wait()
        errf.seek(0)
        err = errf.read().strip().splitlines()
        errf.close()
        if current is None and nxt >= n:
            break                            # finished
        # died inside a case, or between cases (then the next one is blamed: always progress)
        current = current or {"start": nxt, "what": "(the child died before this case)"}
        results.append({"i": current["start"], "what": current["what"], "seconds": None,
                        "verdict": "timeout" if current.get("hung") or p.returncode in (
                            -signal.SIGXCPU, -signal.SIGKILL) else "traceback",
                        "last": (err[-1] if err else "")[:200],
                        "reason": f"the child died (exit {p.returncode})"})
        start = current["start"] + 1
    return results


def report(kinds: list, n: int, seed: int, timeout: float, max_as: int, script: str,
           as_json: str | None) -> int:
    print(f"{n} generated cases per kind, seed {seed}, timeout {timeout} s per case")
    print("| kind | cases | " + " | ".join(VERDICTS) + " | seconds |")
    print("|---|---|" + "---|" * len(VERDICTS) + "---|")
    rows, escapes, t_all = [], [], time.perf_counter()
    for kind in kinds:
        t0 = time.perf_counter()
        res = run_kind(kind, n, seed, timeout, max_as, script)
        counts = {v: sum(r["verdict"] == v for r in res) for v in VERDICTS}
        secs = round(time.perf_counter() - t0, 1)
        rows.append({"kind": kind, "cases": len(res), **counts, "seconds": secs, "results": res})
        print(f"| {kind} | {len(res)} | " + " | ".join(str(counts[v]) for v in VERDICTS)
              + f" | {secs} |", flush=True)
        escapes += [(kind, r) for r in res if r["verdict"] in BAD]
    total = {v: sum(r[v] for r in rows) for v in VERDICTS}
    print(f"| all | {sum(r['cases'] for r in rows)} | "
          + " | ".join(str(total[v]) for v in VERDICTS)
          + f" | {round(time.perf_counter() - t_all, 1)} |")
    if escapes:
        print(f"\n{len(escapes)} escapes (kind, case index, verdict: the input -> last line "
              f"[why]):")
    for kind, r in escapes:
        print(f"- {kind}#{r['i']} {r['verdict']}: {r['what']} -> {r['last']}"
              + (f" [{r['reason']}]" if r.get("reason") else ""))
    if as_json:
        with open(as_json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if escapes else 0
