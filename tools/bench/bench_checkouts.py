"""Issue 30's figures for one or more checkouts, side by side in one run: the streamed compare
of two long recordings, a tiny `ladder run`'s compute, the start-up of `--help` and of a bad
flag, and optionally the sweep's throughput.

    python tools/bench/bench_checkouts.py --checkout BEFORE --checkout AFTER [--rounds 3]
        [--dir DIR] [--steps 294] [--sweep] [--json FILE]

Each checkout is timed by its own code (PYTHONPATH=checkout), in rounds that alternate between
them (A, B, then B, A, ...), so a load that comes and goes on a shared machine falls on both;
each figure is the median of --rounds. Recorded: torch's threads in the comparison (1, as the
streaming bench sets), the CPUs, and per figure every run's value.

- stream: tools/bench/bench_compare_stream.py's child ("stream" mode: both archives read lazily,
  keep="summary") of the checkout, on the archives in --dir (written first with the
  checkout's `ladder dump` if missing): its seconds, archive MB/s, rows, verdict, the
  archive bytes held at most (the lazy reader's count: must not change), and the resident
  set's rise during the comparison (the bench's own measure).
- run: `python -m ladder run` (tiny preset defaults); its own timing line's reference, port
  and compare seconds, and their sum ("compute").
- help / bad flag: wall seconds of `python -m ladder --help` and `python -m ladder run
  --no-such-flag` (exit 2).
- sweep (--sweep): the checkout's tools/bench/bench_sweep.py at -j 2, 48 cases, one repeat per
  round: cases per minute.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time



def _tool(checkout, name):
    """A bench script of `checkout`: tools/bench/NAME since the tools were grouped, tools/NAME
    before (the checkouts compared may predate the move)."""
    grouped = os.path.join(checkout, "tools", "bench", name)
    return grouped if os.path.exists(grouped) else os.path.join(checkout, "tools", name)

def _env(checkout: str) -> dict:
    return dict(os.environ, PYTHONPATH=checkout)


def _wall(checkout: str, argv: list, cwd: str) -> tuple:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "ladder", *argv], env=_env(checkout), cwd=cwd,
                       capture_output=True, text=True)
    return time.perf_counter() - t0, r


def archives(checkout: str, d: str, steps: int) -> tuple:
    """The two archives of the streaming bench (shipped preset, prompt 6), written if absent.

    Written by the first checkout (the oldest schema, which every later reader reads), from a
    neutral directory: `python -m` puts the working directory ahead of PYTHONPATH."""
    paths = []
    for side in ("torch", "reference"):
        p = os.path.join(d, f"shipped-6-{steps}-{side}.safetensors")
        if not os.path.exists(p):
            print(f"writing {p} ...", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "ladder", "dump", side, "--out", p,
                            "--preset", "shipped", "--prompt-len", "6", "--steps", str(steps),
                            "--no-check-plain", "--max-memory", "8G"], check=True,
                           env=_env(checkout), cwd=d, stdout=subprocess.DEVNULL)
        paths.append(p)
    return tuple(paths)


def stream(checkout: str, a: str, b: str) -> dict:
    out = subprocess.run([sys.executable, _tool(checkout, "bench_compare_stream.py"),
                          "--child", "stream", a, b], env=_env(checkout), check=True,
                         capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    size = os.path.getsize(a) + os.path.getsize(b)
    return {"stream_s": r["compare_s"], "stream_mb_per_s": size / 1e6 / r["compare_s"],
            "stream_rows": r["rows"], "stream_passed": r["passed"],
            "stream_held_bytes": r["values_held_bytes"], "stream_threads": r["threads"],
            "stream_rss_peak_mb": r["peak_extra_bytes"] / 1e6}


TIMING = re.compile(r"reference ([\d.]+) s, port ([\d.]+) s, compare ([\d.]+) s")


def run_tiny(checkout: str, cwd: str) -> dict:
    wall, r = _wall(checkout, ["run"], cwd)
    m = TIMING.search(r.stdout)
    if m is None:
        raise SystemExit(f"{checkout}: no timing line in `ladder run`'s output:\n"
                         f"{r.stdout[-1500:]}{r.stderr[-1500:]}")
    ref, port, cmp = map(float, m.groups())
    return {"run_reference_s": ref, "run_port_s": port, "run_compare_s": cmp,
            "run_compute_s": ref + port + cmp, "run_wall_s": wall, "run_exit": r.returncode}


def startup(checkout: str, cwd: str) -> dict:
    help_s, r = _wall(checkout, ["--help"], cwd)
    bad_s, rb = _wall(checkout, ["run", "--no-such-flag"], cwd)
    assert r.returncode == 0 and rb.returncode == 2, (r.returncode, rb.returncode)
    return {"help_s": help_s, "bad_flag_s": bad_s}


def sweep(checkout: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.executable, _tool(checkout, "bench_sweep.py"),
                        "--jobs", "2", "--repeats", "1", "--cases", "48", "--json", f.name],
                       env=_env(checkout), check=True, capture_output=True, text=True)
        got = json.load(open(f.name))
    return {"sweep_cases_per_min": got["cases_per_min"]["2"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkout", action="append", required=True,
                    help="a checkout to time (repeat: before, after)")
    ap.add_argument("--rounds", type=int, default=3, help="runs per figure (median; >= 3)")
    ap.add_argument("--dir", default=None, help="where the archives are (written if absent)")
    ap.add_argument("--steps", type=int, default=294, help="decode steps of the archives")
    ap.add_argument("--sweep", action="store_true", help="also time tools/bench/bench_sweep.py")
    ap.add_argument("--skip", default="", help="comma-separated figures not to time "
                                               "(stream, run, startup)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    checkouts = [os.path.abspath(c) for c in args.checkout]
    d = args.dir or tempfile.mkdtemp(prefix="bench30-")
    os.makedirs(d, exist_ok=True)
    a, b = archives(checkouts[0], d, args.steps) if "stream" not in skip else (None, None)
    runs = {c: [] for c in checkouts}
    cwd = tempfile.mkdtemp(prefix="bench30-cwd-")
    for i in range(args.rounds):
        order = checkouts if i % 2 == 0 else checkouts[::-1]
        for c in order:
            print(f"round {i + 1}/{args.rounds}: {c} ...", file=sys.stderr, flush=True)
            r = {}
            if "startup" not in skip:
                r.update(startup(c, cwd))
            if "run" not in skip:
                r.update(run_tiny(c, cwd))
            if "stream" not in skip:
                r.update(stream(c, a, b))
            if args.sweep:
                r.update(sweep(c))
            runs[c].append(r)
    out = {"cpus": os.cpu_count(), "rounds": args.rounds, "archives": [a, b],
           "checkouts": {}}
    for c in checkouts:
        keys = runs[c][0].keys()
        med = {k: statistics.median(r[k] for r in runs[c])
               if isinstance(runs[c][0][k], (int, float)) and not isinstance(runs[c][0][k], bool)
               else runs[c][0][k] for k in keys}
        out["checkouts"][c] = {"median": med, "runs": runs[c]}
    print(f"{os.cpu_count()} CPUs, median of {args.rounds} alternating rounds")
    names = sorted({k for c in checkouts for k in out["checkouts"][c]["median"]})
    print(f"  {'figure':22s}" + "".join(f"{os.path.basename(c):>16s}" for c in checkouts))
    for k in names:
        vals = [out["checkouts"][c]["median"].get(k) for c in checkouts]
        print(f"  {k:22s}" + "".join(f"{v:16.3f}" if isinstance(v, float) else f"{v!s:>16s}"
                                     for v in vals))
    if len(checkouts) == 2:
        m0, m1 = (out["checkouts"][c]["median"] for c in checkouts)
        for k in ("stream_s", "run_compute_s", "run_compare_s", "help_s", "bad_flag_s"):
            if k in m0 and m1.get(k):
                print(f"  {k}: {m0[k] / m1[k]:.1f}x faster")
        if "sweep_cases_per_min" in m0:
            print(f"  sweep: {m1['sweep_cases_per_min'] / m0['sweep_cases_per_min']:.2f}x "
                  f"the cases per minute")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
