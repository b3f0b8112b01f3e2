"""Proof that a refactor of ladder/ changed no output: run a fixed, seeded set of CLI commands,
record each one's exit status, stdout and every file it wrote (sha256), and compare two such
records.

    PYTHONPATH=. python tools/proofs/ladder_proof.py --out /tmp/ladder_before.json
    PYTHONPATH=. python tools/proofs/ladder_proof.py --out /tmp/ladder_after.json \
        --compare /tmp/ladder_before.json

Each case runs `python -m ladder ...` in its own empty directory under one fixed root (so paths
printed or stored are the same from run to run); the root and the checkout are replaced by
<W> and <R> in stdout. Lines that report wall-clock time (a sweep's timing, a progress bar)
are the only text that is masked: digits inside "N s" / "N ms" figures become '#'. Files are
compared byte for byte, except the same masking inside text reports. stderr is recorded for
the error cases (where it is the output) and masked the same way.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORK = "/tmp/ladder_proof_work"
PORT = "tests.ports.toy_port:build"

# (name, argv after `python -m ladder`, whether stderr is part of the output)
CASES = [
    ("help", ["--help"], False),
    ("run-help", ["run", "--help"], False),
    ("compare-help", ["compare", "--help"], False),
    ("sweep-help", ["sweep", "--help"], False),
    ("run", ["run"], False),
    ("run-native", ["run", "--backend", "native"], False),
    ("run-cq", ["run", "--weights", "cq"], False),
    ("run-fine", ["run", "--fine", "--per-step", "--steps", "3"], False),
    ("run-graph", ["run", "--decode", "graph", "--steps", "3"], False),
    ("run-plant", ["run", "--plant", "rope_pos_plus_1"], False),
    ("run-plant-native", ["run", "--backend", "native", "--plant", "hpost_one"], False),
    ("run-list-faults", ["run", "--list-faults"], False),
    ("run-fixture", ["run", "--fixture", os.path.join(ROOT, "tests/fixtures/v2_forward_vectors")],
     False),
    ("locate-plant", ["locate", "--plant", "window_off_by_one"], False),
    ("locate-native", ["locate", "--backend", "native", "--plant", "attn_gate_skipped"], False),
    ("report-plant", ["report", "--plant", "y_minus_bx", "--out", "rep"], False),
    ("report-clean", ["report", "--out", "rep", "--weights", "cq"], False),
    ("regen", ["regen", "--out", "fx/tiny", "--seed", "3"], False),
    ("regen-needle-rs", ["regen", "--format", "needle-rs", "--out", "nrs/tiny"], False),
    ("rules", ["rules"], False),
    ("points", ["points"], False),
    ("points-shipped", ["points", "--preset", "shipped"], False),
    ("dump-reference", ["dump", "reference", "--out", "ref.safetensors"], False),
    ("dump-torch-last", ["dump", "torch", "--out", "t.safetensors", "--last-only"], False),
    ("dump-native-plant", ["dump", "native-exe", "--out", "n.safetensors", "--plant",
                           "hpost_one"], False),
    ("compare-live", ["compare", "torch", "reference", "--report", "crep"], False),
    ("compare-native", ["compare", "native", "--locate"], False),
    ("compare-port", ["compare", "port", "--port", PORT], False),
    ("run-port", ["run", "--port", PORT], False),
    ("v41-run", ["run", "--model", "attn_v41"], False),
    ("v41-locate", ["locate", "--model", "attn_v41"], False),
    ("v41-report", ["report", "--model", "attn_v41", "--out", "v41rep"], False),
    ("sweep-tiny", ["sweep", os.path.join(ROOT, "docs/sweep-tiny.toml"), "--out", "sw",
                    "-j", "1", "--archives", "failing"], False),
    ("sweep-dry", ["sweep", os.path.join(ROOT, "docs/sweep-tiny.toml"), "--out", "sw2",
                   "--dry-run", "--shard", "2/3"], False),
    ("bad-flag", ["run", "--steps", "-3"], True),
    ("bad-plant", ["run", "--plant", "no_such_fault"], True),
    ("bad-file", ["compare", "/nonexistent.safetensors"], True),
    ("bad-command", ["frobnicate"], True),
]
# After a case, files it wrote that a later case reads (compare of two dumps).
AFTER = [
    ("compare-dumps", ["compare", "<W>/dump-torch-last/t.safetensors",
                       "<W>/dump-reference/ref.safetensors"], False),
    ("compare-native-dump", ["compare", "<W>/dump-native-plant/n.safetensors", "--locate"],
     False),
    ("compare-dump-ref", ["compare", "<W>/dump-reference/ref.safetensors", "--report", "r2"],
     False),
    ("sweep-merge", ["sweep", "--merge", "<W>/sweep-tiny/sw", "--out", "merged"], False),
]

_TIME = re.compile(r"\d+(?:\.\d+)?(?=\s?(?:s|ms|min)\b)")
_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z?")
_WROTE = re.compile(r"^(wrote .*\()\d+( bytes\))", re.M)
_TEXT = (".md", ".html", ".txt", ".svg", ".toml", ".py")


def mask(text: str) -> str:
    text = text.replace(WORK, "<W>").replace(ROOT, "<R>")
    text = _WROTE.sub(r"\1#\2", _STAMP.sub("<T>", text))
    return _TIME.sub("#", text)


def _untimed(v):
    if isinstance(v, dict):
        return {k: _untimed(x) for k, x in v.items() if k != "timing"}
    if isinstance(v, list):
        return [_untimed(x) for x in v]
    return v


def digest(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".json"):
        text = mask(json.dumps(_untimed(json.loads(data)), sort_keys=True))
        data = text.encode()
    elif path.endswith(".csv"):
        rows = list(csv.reader(io.StringIO(data.decode("utf-8"))))
        drop = rows[0].index("seconds") if rows and "seconds" in rows[0] else None
        data = mask("\n".join(",".join(c for i, c in enumerate(r) if i != drop)
                               for r in rows)).encode()
    elif path.endswith(_TEXT):
        data = mask(data.decode("utf-8", "replace")).encode()
    return hashlib.sha256(data).hexdigest()


def run_case(case) -> tuple:
    name, argv, with_err = case
    cwd = os.path.join(WORK, name)
    shutil.rmtree(cwd, ignore_errors=True)
    os.makedirs(cwd)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", COLUMNS="100")
    argv = [a.replace("<W>", WORK) for a in argv]
    p = subprocess.run([sys.executable, "-m", "ladder", *argv], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=900)
    files = {}
    for d, _, names in os.walk(cwd):
        for n in names:
            full = os.path.join(d, n)
            files[os.path.relpath(full, cwd)] = digest(full)
    rec = {"argv": argv, "rc": p.returncode, "stdout": mask(p.stdout), "files": dict(sorted(files.items()))}
    if with_err:
        rec["stderr"] = mask(p.stderr)
    return name, rec


def record(jobs: int) -> dict:
    os.makedirs(WORK, exist_ok=True)
    with ThreadPoolExecutor(jobs) as ex:
        out = dict(ex.map(run_case, CASES))
    out.update(map(run_case, AFTER))
    return out


def diff(a: dict, b: dict) -> list:
    bad = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            bad.append(f"{name}: only in {'after' if name in a else 'before'}")
            continue
        for key in ("rc", "stdout", "stderr", "files"):
            if a[name].get(key) != b[name].get(key):
                bad.append(f"{name}: {key} differs")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the record to write (JSON)")
    ap.add_argument("--compare", help="a record to compare the new one with")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    rec = record(args.jobs)
    with open(args.out, "w") as f:
        json.dump(rec, f, indent=1, sort_keys=True)
    files = sum(len(r["files"]) for r in rec.values())
    print(f"{len(rec)} commands, {files} files written, recorded in {args.out}")
    if args.compare:
        with open(args.compare) as f:
            before = json.load(f)
        bad = diff(rec, before)
        same = len(rec) - len({b.split(':')[0] for b in bad})
        print(f"{same} of {len(rec)} commands identical (exit status, stdout, files)")
        for line in bad:
            print("  " + line)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
