"""`ladder shrink` on every planted fault of `--list-faults`, on each backend it lives in (torch
and native), held to a minimal schedule found independently, and its reproducer run both ways.

    PYTHONPATH=. python tools/hostile/shrink_faults.py [--only NAME ...] [--json OUT]

For each (fault, backend):
  - `python -m ladder shrink --plant FAULT --backend B --out DIR` (in process), its schedule,
    divergence, candidates and seconds;
  - an independent brute force over the smallest schedules, in the order shrink minimises
    (positions, then window): every prompt / step split of n positions, of canonical ids and
    of the run's own first n seeded ids, on every window up to n, n = 1, 2, ... until one
    shows the same point and verdict; that n is the minimum shrink must reach (it may not be
    larger);
  - DIR's pytest file run twice in DIR: with --ladder-plant FAULT (must fail) and without
    (must pass).
Prints one row per case and the median seconds and candidates; exit 1 if any check fails.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def cases() -> list:
    from ladder.sides.faults import FAULTS
    from ladder.sides.path_faults import PATH_FAULTS
    out = []
    for name, f in FAULTS.items():
        for backend in ("torch", "native"):
            if not f.not_in(backend):
                out.append((name, backend, "cq" if f.weights == "cq" else None, "eager"))
    for name, f in PATH_FAULTS.items():
        out.append((name, "torch", None, f.decode))
    return out


def _flags(backend, weights, decode) -> list:
    return ["--backend", backend, "--decode", decode] + (["--weights", weights] if weights
                                                          else [])


def shrink(fault, backend, weights, decode, out_dir) -> dict:
    from ladder.cli.main import main
    lines = []
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):
        rc = main(["shrink", "--plant", fault, *_flags(backend, weights, decode), "--out",
                   out_dir], out=lines.append)
    text = "\n".join(lines)
    best = text.split("smallest schedule: ", 1)[1].splitlines()[0] if rc == 0 else ""
    div = text.split("divergence: ", 1)[1].splitlines()[0] if rc == 0 else text[-300:]
    tried = int(text.rsplit("; ", 1)[1].split(" candidates")[0]) if rc == 0 else 0
    m = re.match(r"(.*?)(?: \((\w+)\))? first at ", div)
    return {"rc": rc, "best": best, "positions": int(best.split(" position")[0]) if best else 0,
            "divergence": div, "point": m.group(1) if m else div,
            "verdict": (m.group(2) or "") if m else "", "candidates": tried,
            "seconds": round(time.perf_counter() - t0, 2)}


def brute_minimum(fault, backend, weights, decode, point, verdict, most=6) -> int | None:
    """The fewest positions of a schedule of canonical ids, or of the run's own seeded ids
    (any split, any window <= n), that shows `point` with `verdict`, found without the
    shrinker; None past `most`."""
    from ladder.cli.shrink import _divergence
    from ladder.sides import faults, path_faults
    from ladder.sides.capture import PathError
    from ladder.sides.judge import ModelUnderTest, judge
    model = ModelUnderTest.build(weights=weights)
    path = path_faults.PATH_FAULTS.get(fault)
    ctx = path.plant() if path is not None else faults.planted(fault, backend)
    with ctx:
        for n in range(1, most + 1):
            for w, p, toks in ((w, p, toks) for w in range(1, min(n, model.cfg.kv_window) + 1)
                               for p in range(1, n + 1)
                               for toks in ([1] * n, model.tokens(18)[:n])):
                try:
                    v = judge(model.our_port(backend, decode), model, tokens=toks,
                              prompt_len=p, window=w, check_plain=path is not None)
                    got = _divergence(v)
                    got = None if got is None else (got.point, got.verdict)
                except PathError as e:
                    got = (f"{e.path}:{e.point}", "path")
                if got == (point, verdict):
                    return n
    return None


def pytest_both_ways(d, fault) -> tuple:
    run = lambda *flags: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", d, *flags],
        capture_output=True, text=True, cwd=d, timeout=600).returncode
    return run("--ladder-plant", fault), run()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="fault names to run")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    import torch
    torch.set_flush_denormal(True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| fault | backend | shrunk to | point (verdict) | brute-force minimum | candidates | "
          "seconds | reproducer with / without the fault | ok |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows, bad = [], 0
    for fault, backend, weights, decode in cases():
        if args.only and fault not in args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            d = os.path.join(tmp, "repro")
            r = shrink(fault, backend, weights, decode, d)
            r["brute"] = brute_minimum(fault, backend, weights, decode, r["point"],
                                       r["verdict"]) if r["rc"] == 0 else None
            r["reproducer"] = pytest_both_ways(d, fault) if r["rc"] == 0 else (None, None)
        ok = r["rc"] == 0 and r["brute"] is not None and r["positions"] <= r["brute"] \
            and r["reproducer"] == (1, 0)
        bad += not ok
        rows.append({"fault": fault, "backend": backend, **r, "ok": ok})
        print(f"| {fault} | {backend}{' cq' if weights else ''}{' graph' if decode != 'eager' else ''}"
              f" | {r['best']} | {r['divergence'].split(' first')[0]} | {r['brute']} | "
              f"{r['candidates']} | {r['seconds']} | exit {r['reproducer'][0]} / "
              f"{r['reproducer'][1]} | {'yes' if ok else 'NO'} |", flush=True)
    secs = [r["seconds"] for r in rows if r["rc"] == 0]
    cands = [r["candidates"] for r in rows if r["rc"] == 0]
    if secs:
        print(f"median {statistics.median(secs):.2f} s and {statistics.median(cands)} candidates "
              f"per shrink over {len(secs)} cases; {bad} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
