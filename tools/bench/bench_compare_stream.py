"""How `ladder compare` streams two trace archives: peak memory and time against the in-memory
comparison `run` does on the same ladders.

    python tools/bench/bench_compare_stream.py [--preset shipped] [--prompt-len 6] [--steps 294]
                                         [--dir DIR] [--json FILE]

Writes (or reuses, in --dir) two archives of the same schedule: the torch port's dump and the
reference's (`python -m ladder dump`). Then, each in its own child process so one cannot warm
the other's memory: "memory" loads both ladders whole and times compare_ladders folded (what
`run` spends comparing), "memory-all" the same keeping every row (`run --per-step`, `locate`,
`report`); "run" runs `python -m ladder run` on the schedule and reads the comparison time
its timing line prints; "stream" opens both lazily (ladder/engine/archive.py LazyValues: one step of each
side held) and times the same call. Peak memory is the child's peak resident set during the
comparison above its resident set just before it (the kernel's high-water mark, reset first
through /proc/self/clear_refs; after a warm-up comparison of one step, so one-time costs are
not counted), beside the largest single step of the two archives together.
The comparison's own result rows (one PointResult per step and point) are counted separately:
they are the output, and grow with the schedule whatever the inputs' layout. Expected runtime
on the 2-core machine at the shipped defaults: about 3 minutes to write the archives, 1 minute
for the four comparisons (interleaved, --repeat each). Records thread count, medians of --repeat runs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def child_run(preset: str, prompt_len: str, steps: str) -> dict:
    """`python -m ladder run` itself on the same schedule, in this process: the comparison
    time its own timing line prints (compare_ladders in the state a real run leaves)."""
    import re

    import torch
    torch.set_flush_denormal(True)
    torch.set_num_threads(1)
    from ladder.cli.main import main
    lines = []
    rc = main(["run", "--preset", preset, "--prompt-len", prompt_len, "--steps", steps,
               "--no-check-plain"], out=lines.append)
    text = "\n".join(map(str, lines))
    m = re.search(r"compare ([0-9.]+) s, total", text)
    if rc != 0 or m is None:
        raise SystemExit(f"run exited {rc}: {text[-500:]}")
    return {"mode": "run", "compare_s": float(m.group(1)), "threads": torch.get_num_threads()}


def child(mode: str, a: str, b: str) -> dict:
    import torch
    torch.set_flush_denormal(True)
    torch.set_num_threads(1)
    if mode == "run":
        return child_run(*a.split(":"))
    from ladder.engine.compare import compare_ladders
    from ladder.engine.rules import DEFAULT_RULES
    from ladder.engine.trace import Ladder
    la, lb = Ladder.load(a, lazy=mode == "stream"), Ladder.load(b, lazy=mode == "stream")
    largest = 0
    for st in lb.steps:
        n = 0
        for lad in (la, lb):
            for p in lad.points(st.name):
                if lad.values is not None and hasattr(lad.values, "_infos"):
                    shape = lad.values._infos[f"{st.name}/{p}"][1]
                    k = 4
                    for d in shape:
                        k *= d
                    n += k
                else:
                    t = lad[f"{st.name}/{p}"]
                    n += t.numel() * t.element_size()
        largest = max(largest, n)
    # Warm up on one decode step first: the first comparison in a process pays ~25 MB of
    # one-time costs (kernels, numpy and allocator arenas) whatever the ladders' size, which
    # would otherwise read as the comparison's memory.
    st = la.steps[1] if len(la.steps) > 1 else la.steps[0]
    sub = lambda lad: Ladder([st], {f"{st.name}/{p}": lad[f"{st.name}/{p}"]  # noqa: E731
                                    for p in lad.points(st.name)}, lad.label)
    keep = "all" if mode == "memory-all" else "summary"
    compare_ladders(sub(la), sub(lb), DEFAULT_RULES, keep=keep)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                          # reset VmHWM to the current RSS
    except OSError:
        pass
    before = _rss_kib("VmRSS")
    t0 = time.perf_counter()
    # memory: what `run` does (in memory, rows folded); memory-all: every row kept; stream:
    # what `compare` does (read lazily, rows folded)
    cmp = compare_ladders(la, lb, DEFAULT_RULES, keep=keep)
    dt = time.perf_counter() - t0
    peak = _rss_kib("VmHWM")
    rows = sum(sys.getsizeof(r) + sys.getsizeof(r.errors) for r in cmp.rows)
    # the archives' bytes in memory at once, counted by the lazy reader (exact, unlike RSS)
    held = sum(getattr(lad.values, "peak_held", 0) for lad in (la, lb))
    return {"mode": mode, "compare_s": dt, "peak_extra_bytes": (peak - before) * 1024,
            "largest_step_bytes": largest, "rows": cmp.total_rows if cmp.folded else
            len(cmp.rows), "rows_kept": len(cmp.rows), "rows_bytes": rows,
            "passed": cmp.passed, "threads": torch.get_num_threads(),
            "values_held_bytes": held if mode == "stream" else largest_all(la, lb)}


def largest_all(la, lb) -> int:
    """In memory: every value of both ladders is held."""
    return sum(v.numel() * v.element_size() for lad in (la, lb) for v in lad.values.values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="shipped", choices=["tiny", "shipped"])
    ap.add_argument("--prompt-len", type=int, default=6)
    ap.add_argument("--steps", type=int, default=294)
    ap.add_argument("--dir", default=None, help="where the archives go (reused if present)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    import tempfile
    d = args.dir or tempfile.mkdtemp(prefix="bench-stream-")
    os.makedirs(d, exist_ok=True)
    flags = ["--preset", args.preset, "--prompt-len", str(args.prompt_len), "--steps",
             str(args.steps), "--no-check-plain", "--max-memory", "8G"]
    paths = {}
    env = dict(os.environ, PYTHONPATH=REPO)
    for side in ("torch", "reference"):
        p = paths[side] = os.path.join(d, f"{args.preset}-{args.prompt_len}-{args.steps}-{side}"
                                          f".safetensors")
        if not os.path.exists(p):
            print(f"writing {p} ...", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "ladder", "dump", side, "--out", p, *flags],
                           check=True, env=env, stdout=subprocess.DEVNULL)
    results = {}
    modes = ("run", "memory", "memory-all", "stream")
    runs = {m: [] for m in modes}
    for i in range(args.repeat):            # interleaved: a slow spell falls on every mode
        for mode in modes:
            print(f"{mode} {i + 1}/{args.repeat} ...", file=sys.stderr, flush=True)
            a = f"{args.preset}:{args.prompt_len}:{args.steps}" if mode == "run" else \
                paths["torch"]
            out = subprocess.run([sys.executable, __file__, "--child", mode, a,
                                  paths["reference"]], check=True, env=env,
                                 capture_output=True, text=True).stdout
            runs[mode].append(json.loads(out.strip().splitlines()[-1]))
    for mode, rs in runs.items():
        rs.sort(key=lambda r: r["compare_s"])
        results[mode] = dict(rs[len(rs) // 2], compare_s_all=[r["compare_s"] for r in rs])
    mem, st = results["memory"], results["stream"]
    every = results["memory-all"]
    archive_bytes = sum(os.path.getsize(p) for p in paths.values())
    print(f"{args.preset}, prompt {args.prompt_len} + {args.steps} steps, {st['rows']} rows, "
          f"{st['threads']} torch thread(s), median of {args.repeat}")
    for r in (mem, every, st):
        r["archive_mb_per_s"] = archive_bytes / 1e6 / r["compare_s"]
    print(f"  archives {archive_bytes / 1e6:.0f} MB: stream compares "
          f"{st['archive_mb_per_s']:.0f} MB/s of archive, {st['rows'] / st['compare_s']:.0f} "
          f"rows/s")
    for r in (mem, every, st):
        print(f"  {r['mode']:10s}: compare {r['compare_s']:.2f} s, archive values held at most "
              f"{r['values_held_bytes'] / 1e6:.1f} MB, RSS peak +{r['peak_extra_bytes'] / 1e6:.1f} "
              f"MB (largest step {r['largest_step_bytes'] / 1e6:.1f} MB, result rows "
              f"{r['rows_bytes'] / 1e6:.1f} MB)")
    print(f"  stream values held / largest step: "
          f"{st['values_held_bytes'] / st['largest_step_bytes']:.2f}x")
    run = results["run"]
    print(f"  run       : compare {run['compare_s']:.2f} s (its own timing line: `python -m "
          f"ladder run` on this schedule, in one process)")
    print(f"  run / stream time: {run['compare_s'] / st['compare_s']:.2f}x; run's folded "
          f"comparison on the loaded archives / stream: {mem['compare_s'] / st['compare_s']:.2f}x; "
          f"every row kept / stream: {every['compare_s'] / st['compare_s']:.2f}x")
    print(f"  stream / memory time: {st['compare_s'] / mem['compare_s']:.2f}x; stream peak / "
          f"largest step: {st['peak_extra_bytes'] / st['largest_step_bytes']:.2f}x "
          f"(less the rows: {(st['peak_extra_bytes'] - st['rows_bytes']) / st['largest_step_bytes']:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(results, archive_bytes=archive_bytes), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
