"""Sweep throughput on this machine: cases per minute at `-j 1` and `-j 2`, and the ratio.

    python tools/bench/bench_sweep.py [--cases 48] [--repeats 3] [--jobs 1,2] [--threads 1]
                                [--prompt-len 4] [--steps 4] [--json FILE]

Builds a grid of --cases tiny-preset cases (seeds 0..N-1, dense weights, no plain check: the
work of a real sweep at its smallest) and runs it through the sweep's own runner
(`ladder.sweep.command.run_cases`: in this process at -j 1; above, in this process beside
N - 1 spawned workers), each measurement into a fresh directory, so nothing is resumed. The
-j values are measured side by side in one run, alternating (1, 2, then 2, 1, ...), so a load that comes and goes on a
shared machine falls on both; each is the median of --repeats. Timed: from the first case
submitted to the last result written, pool start-up included (what a user waits for), after
one warm-up case. torch.set_flush_denormal(True) in every process that computes; the threads
per worker, CPUs and torch version are recorded, and each case's own time in its worker
(its median: flat across -j means the workers do not slow each other). About 1.5 minutes at
the defaults on the 2-core development machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=48, help="cases per measurement (default 48)")
    ap.add_argument("--repeats", type=int, default=3, help="measurements per -j (median; "
                                                           "default 3)")
    ap.add_argument("--jobs", default="1,2", help="the -j values, comma-separated (default 1,2)")
    ap.add_argument("--threads", type=int, default=1, help="threads per worker (default 1)")
    ap.add_argument("--prompt-len", type=int, default=4, help="each case's prompt (default 4)")
    ap.add_argument("--steps", type=int, default=4, help="each case's decode steps (default 4)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the numbers here")
    return ap


def check_args(args) -> list:
    """The -j values, or SystemExit naming the bad flag, before any measurement."""
    from ladder.sweep.command import cpus
    try:
        jobs = [int(j) for j in args.jobs.split(",")]
    except ValueError:
        raise SystemExit(f"--jobs {args.jobs!r}: comma-separated integers, e.g. 1,2") from None
    for flag, v, lo in (("--cases", args.cases, 1), ("--repeats", args.repeats, 1),
                        ("--threads", args.threads, 1), ("--prompt-len", args.prompt_len, 1),
                        ("--steps", args.steps, 0), *(("--jobs", j, 1) for j in jobs)):
        if v < lo:
            raise SystemExit(f"{flag} {v}: must be >= {lo}")
    if max(jobs) * args.threads > cpus():
        raise SystemExit(f"--jobs {max(jobs)} x --threads {args.threads}: more threads than "
                         f"the {cpus()} CPUs here (the sweep refuses to oversubscribe)")
    return jobs


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    jobs = check_args(args)
    import torch
    torch.set_flush_denormal(True)
    from ladder.cli.progress import Stages
    from ladder.sweep.command import cpus, jobs_for, run_cases, validate_cases
    from ladder.sweep.grid import load_grid
    say = Stages("bench_sweep")
    tmp = tempfile.mkdtemp(prefix="bench-sweep-")
    try:                    # every measurement's directory: archives of every case, MBs
        grid_path = os.path.join(tmp, "bench.toml")
        with open(grid_path, "w") as f:
            f.write(f"[sweep]\nname = \"bench\"\n[grid]\nseed = {list(range(args.cases))}\n"
                    f"[fixed]\npreset = \"tiny\"\nprompt_len = {args.prompt_len}\n"
                    f"steps = {args.steps}\nweights = \"dense\"\nno_check_plain = true\n")
        grid = load_grid(grid_path)
        validate_cases(grid)
        say(f"{len(grid.cases)} cases (tiny, prompt {args.prompt_len} + {args.steps} steps), "
            f"-j {args.jobs} x {args.threads} thread(s), {args.repeats} repeats, in {tmp}")
        run_cases(jobs_for(grid.cases[:1], os.path.join(tmp, "warm"), grid.base), 1,
                  args.threads, False, lambda row: None, flush_denormal=True)
        seconds, per_case = {j: [] for j in jobs}, {j: [] for j in jobs}
        for r in range(args.repeats):
            for j in (jobs if r % 2 == 0 else jobs[::-1]):
                out = os.path.join(tmp, f"r{r}-j{j}")
                say(f"repeat {r + 1}/{args.repeats}: -j {j}")
                t0 = time.perf_counter()
                run_cases(jobs_for(grid.cases, out, grid.base), j, args.threads, False,
                          lambda row: per_case[j].append(row["timing"]["seconds"]),
                          flush_denormal=True)
                seconds[j].append(time.perf_counter() - t0)
                say(f"repeat {r + 1}/{args.repeats}: -j {j}: {seconds[j][-1]:.2f} s, "
                    f"{len(grid.cases) / seconds[j][-1] * 60:.1f} cases/min")
        rate = {j: len(grid.cases) / statistics.median(s) * 60 for j, s in seconds.items()}
        print(f"sweep throughput, {len(grid.cases)} tiny cases (prompt {args.prompt_len} + "
              f"{args.steps} steps, dense, no plain check), {args.threads} thread(s) per worker, "
              f"{cpus()} CPUs ({_cpu_name()}), torch {torch.__version__}, median of "
              f"{args.repeats}, alternating:")
        # s per case: one case's own time inside its worker; if it stays flat as -j grows, the
        # workers do not slow each other and what -j loses is the pool's start-up
        print(f"{'-j':>3s} {'s per sweep (each repeat)':>30s} {'cases/min':>10s} "
              f"{'vs -j ' + str(jobs[0]):>8s} {'s per case':>11s}")
        for j in jobs:
            each = ", ".join(f"{s:.2f}" for s in seconds[j])
            print(f"{j:3d} {each:>30s} {rate[j]:10.1f} {rate[j] / rate[jobs[0]]:7.2f}x "
                  f"{statistics.median(per_case[j]):11.3f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"cases": len(grid.cases), "prompt_len": args.prompt_len,
                           "steps": args.steps, "threads_per_worker": args.threads,
                           "cpus": cpus(), "cpu": _cpu_name(), "torch": torch.__version__,
                           "flush_denormal": True, "repeats": args.repeats,
                           "seconds": {str(j): s for j, s in seconds.items()},
                           "median_case_seconds": {str(j): statistics.median(per_case[j])
                                                   for j in jobs},
                           "cases_per_min": {str(j): rate[j] for j in jobs},
                           "ratio": {str(j): rate[j] / rate[jobs[0]] for j in jobs}}, f, indent=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
