"""`python -m ladder sweep GRID.toml --out DIR`: many `run`s over a grid, one report.

Each case (ladder/sweep/grid.py) is one `run` in-process: the CLI's own parser and checks,
`compare_run`, `locate` on a divergence (inside the planted fault, when the case plants one).
It leaves, under DIR/cases/<id>/:

    trace.safetensors   the port's ladder as a trace archive (--archives all|failing|none)
    log.txt             what the run printed, the comparison and the located divergence
    result.json         the case's row, written last and atomically (ladder/engine/atomic.py)

so a result file exists only for a finished case, and a sweep killed at any instant (even
SIGKILL) loses only the cases it was running: the same command again skips every case with a
result and re-runs the rest from scratch. DIR/sweep.json holds the grid and its hash; a
directory holding another grid is refused. `--shard K/N` runs every N-th case; `sweep --merge
DIR...` joins shards (ladder/sweep/report.py, which also writes every sweep's report).

`-j N` computes in N processes: this one and N - 1 workers (spawned, not forked: a forked
torch with live OpenMP threads can hang), so the first cases run while the workers import.
Each is pinned to its share of the CPUs (--threads, default CPUs // N): the OMP/MKL
variables are set before the workers start and again in their initializer, with
torch.set_num_threads and the native step's own thread count, so N processes never run more
threads than there are CPUs. Rows cross the pool as plain dicts; on disk they are JSON. The
workers die with the sweep however it ends (_die_with_parent), and each holds at most one
case at a time, so a killed sweep leaves nothing running or queued behind it. A
result.json is read back as hostile input (sweep_row.read_row): a bad one is a case not done.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from concurrent.futures import BrokenExecutor

from ladder.sweep.grid import (FORMAT, SCHEMA, Case, SweepError, load_grid, parse_shard,
                               run_args, run_argv, shard_cases)

ARCHIVES = ("all", "failing", "none")
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="many runs over a TOML grid: sharded, resumable, one "
                                     "report (md, csv, html heat map)")
    p.add_argument("grid", nargs="?", default=None, metavar="GRID.toml",
                   help="the grid: [grid] lists of run flags, [fixed], [[exclude]]")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the sweep directory (cases/, sweep.json, report.*); with --merge, "
                        "where the merged report goes")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="run shard K of N (cases with index %% N == K-1); default 1/1")
    p.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                   help="processes computing cases on this machine: this one and N - 1 "
                        "workers (default 1)")
    p.add_argument("--threads", type=int, default=None, metavar="T",
                   help="threads per worker (default: CPUs // --jobs)")
    p.add_argument("--archives", default="all", choices=ARCHIVES,
                   help="which cases keep their trace archive (default all)")
    p.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                   help="join these sweep directories (shards of one grid) into one report")
    p.add_argument("--allow-partial", action="store_true",
                   help="--merge: write the report even when cases are missing (listed)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the grid and list this shard's cases; run nothing")


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                      # not Linux
        return os.cpu_count() or 1


def threads_per_worker(args) -> int:
    return args.threads if args.threads else max(1, cpus() // args.jobs)


def check_flags(args) -> None:
    """The sweep's flags alone, before any file is read (cli.main -> ladder/cli/args.py)."""
    from ladder.cli.args import writable_dir
    if args.merge is not None:
        if args.grid is not None:
            raise SweepError(f"sweep {args.grid} --merge: give a grid to run, or --merge "
                             f"DIR... to join finished sweeps, not both")
        for flag, bad in (("--shard", args.shard is not None), ("--dry-run", args.dry_run)):
            if bad:
                raise SweepError(f"sweep --merge: {flag} applies to running a grid, not to "
                                 f"merging")
    else:
        if args.grid is None:
            raise SweepError("sweep: give the grid file (sweep GRID.toml --out DIR), or "
                             "--merge DIR... --out DIR")
        if args.allow_partial:
            raise SweepError("sweep --allow-partial: only with --merge (a running sweep "
                             "reports its own missing cases)")
        parse_shard(args.shard or "1/1")
    if args.jobs < 1:
        raise SweepError(f"-j {args.jobs}: must be >= 1 (processes computing cases)")
    if args.jobs > cpus():
        raise SweepError(f"-j {args.jobs}: more workers than the {cpus()} CPUs this process "
                         f"may use; they would only contend (use -j {cpus()} or fewer)")
    if args.threads is not None and args.threads < 1:
        raise SweepError(f"--threads {args.threads}: must be >= 1")
    if args.threads is not None and args.threads * args.jobs > cpus():
        raise SweepError(f"--threads {args.threads} x -j {args.jobs} = "
                         f"{args.threads * args.jobs} threads on {cpus()} CPUs: "
                         f"oversubscribed; lower one (--threads {max(1, cpus() // args.jobs)})")
    if not args.out.strip():
        raise SweepError(f"--out {args.out!r}: empty; give the sweep directory")
    writable_dir("--out", args.out)


def _check_plant(args) -> None:
    """--plant judged as cli/commands.py's with_fault judges it, without planting anything."""
    from ladder.sides import faults, path_faults
    from ladder.sides.model_input import LadderInputError
    name = args.plant
    path = path_faults.PATH_FAULTS.get(name)
    fault = faults.FAULTS.get(name)
    weights = args.weights or ("cq" if args.cact else "dense")
    why = (path.not_in(args.backend, args.decode) if path is not None else
           f"unknown; `run --list-faults` names them" if fault is None else
           f"lives in {fault.weights} weights, this case uses --weights {weights}"
           if fault.weights == "cq" != weights else fault.not_in(args.backend) or fault.needs)
    if why:
        raise LadderInputError(f"--plant {name}: {why}")


def _check_port(args) -> None:
    """A protocol port case: the factory imports, and no flag of our own backends is set
    (it would be silently ignored: the port is what it is)."""
    from ladder.sides.model_input import LadderInputError
    from ladder.sides.ports import PortLoadError, load_factory
    ours = [f"--{k.replace('_', '-')} {v}" for k, v, d in
            (("backend", args.backend, "torch"), ("decode", args.decode, "eager"),
             ("device", args.device, "cpu"), ("plant", args.plant, None))
            if v != d]
    if ours:
        raise LadderInputError(f"--port {args.port}: {ours[0]} applies to our port "
                               f"(port.V2Model), not to a protocol port")
    try:
        load_factory(args.port)
    except PortLoadError as e:
        raise LadderInputError(str(e)) from None


def validate_cases(grid) -> None:
    """Every case's flags through the CLI's own checks (ladder/cli/args.py), and the limits its
    model sets (check_model), before any case runs: a sweep never stops half-way on a typo."""
    from reference.config import V2Config
    from ladder.cli.errors import input_errors
    from ladder.sides.model_input import load_model
    from ladder.cli.args import check, check_model
    from ladder.engine.rules import load_rules
    configs, rules = {}, set()
    for case in grid.cases:
        try:
            args = run_args(case, grid.base)
            check(args)
            if args.plant:
                _check_plant(args)
            if args.port:
                _check_port(args)
            if args.rules and args.rules not in rules:
                load_rules(args.rules)
                rules.add(args.rules)
            key = (args.params, args.cact, None if args.params or args.cact else args.preset)
            if key not in configs:              # a file's config: loaded once per file
                configs[key] = V2Config.preset(args.preset) if key[2] else \
                    load_model(args)[1]
            check_model(args, configs[key])
        except input_errors() as e:
            raise SweepError(f"{grid.path}: case {case.id} ({case.describe()}): {e}") from None


def _clean_case_dir(out: str, case_id: str) -> str:
    """The case's directory, emptied: leftovers of a run killed mid-case (a half-written
    archive's .tmp, an archive without its result) are not this run's."""
    d = os.path.join(out, "cases", case_id)
    if os.path.lexists(d):
        if os.path.islink(d) or not os.path.isdir(d):
            os.unlink(d)
        else:
            shutil.rmtree(d)
    os.makedirs(d)
    return d


def run_case(job: dict) -> dict:
    """Run one case, write its files (result.json last); its row. `job` is a plain dict so it
    crosses the process pool: case {index, id, settings}, out, base, archives."""
    from ladder.engine.atomic import write_all
    from ladder.sweep.row import case_row
    case = Case(**job["case"])
    d = _clean_case_dir(job["out"], case.id)
    started, t0 = time.time(), time.perf_counter()
    row, lines, archive = case_row(case, job["base"])
    if archive is not None and (job["archives"] == "all" or
                                (job["archives"] == "failing" and row["status"] != "pass")):
        path = os.path.join(d, "trace.safetensors")
        ladder, manifest = archive
        ladder.save(path, **manifest)
        from ladder.sides.side_spec import file_sha256
        row["archive"] = {"path": f"cases/{case.id}/trace.safetensors",
                          "sha256": file_sha256(path), "bytes": os.path.getsize(path)}
    row["timing"] = {"seconds": round(time.perf_counter() - t0, 4),
                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))}
    write_all({os.path.join(d, "log.txt"): "\n".join(lines) + "\n"})
    write_all({os.path.join(d, "result.json"): json.dumps(row, indent=1) + "\n"})
    return row


def _die_with_parent(parent: int) -> None:
    """End this worker when the sweep that spawned it dies, however it dies: a SIGKILLed
    parent runs no cleanup, and its orphaned workers would go on taking queued cases and
    writing into cases/, racing the resumed sweep. Linux: the kernel's parent-death signal;
    elsewhere, a thread polling the parent pid."""
    import signal
    import threading
    armed = False
    if sys.platform.startswith("linux"):
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        # sent when the thread that spawned this worker ends: the sweep's main thread, since
        # it submits and so spawns (run_cases), so in effect when the sweep ends
        armed = libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0      # 1: PR_SET_PDEATHSIG
    if not armed:                       # not Linux, or prctl refused (a seccomp sandbox)
        def watch():
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(1)
        threading.Thread(target=watch, name="sweep-parent-watch", daemon=True).start()
    if os.getppid() != parent:          # the parent died before the signal was armed
        os._exit(1)


def _init_worker(threads: int, native: bool, flush_denormal: bool = False,
                 parent: int | None = None) -> None:
    """A process set up to compute cases: `threads` threads; a pool worker (`parent`, the
    sweep's pid) also dies with the sweep."""
    if parent is not None:
        _die_with_parent(parent)
    for v in THREAD_VARS:
        os.environ[v] = str(threads)
    import torch
    torch.set_num_threads(threads)
    if flush_denormal:                      # tools/bench/bench_sweep.py only: `run` never sets it
        torch.set_flush_denormal(True)
    if native:
        from kernels.native import set_threads
        set_threads(threads)


@contextlib.contextmanager
def _pinned(threads: int, native: bool, flush_denormal: bool = False):
    """This process (and the workers it spawns, which inherit the environment) at `threads`
    threads for the sweep; restored after, so an in-process caller keeps its own."""
    import torch
    saved, before = {v: os.environ.get(v) for v in THREAD_VARS}, torch.get_num_threads()
    try:
        _init_worker(threads, native, flush_denormal)
        yield
    finally:
        for v, old in saved.items():
            if old is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = old
        torch.set_num_threads(before)


def jobs_for(cases: list, out: str, base: str, archives: str = "all") -> list:
    """The plain dicts run_case takes, one per case."""
    return [{"case": {"index": c.index, "id": c.id, "settings": c.settings},
             "out": os.path.abspath(out), "base": base, "archives": archives} for c in cases]


def run_cases(jobs: list, workers: int, threads: int, native: bool, on_row,
              flush_denormal: bool = False, work=None) -> None:
    """work(job) for every job (default run_case), on_row (in this thread) per finished: in
    this process at -j 1; at -j N in this process beside N - 1 spawned workers. This process
    has its imports done, so it computes from the first instant while a worker spends its
    first seconds importing. `work` must be importable by name (a spawned worker imports it)."""
    work = work or run_case
    with _pinned(threads, native, flush_denormal):
        if workers == 1 or len(jobs) <= 1:     # no pool to start for one case
            for job in jobs:
                on_row(work(job))
            return
        _beside_workers(jobs, min(workers, len(jobs)) - 1, threads, native, flush_denormal,
                        on_row, work)


def _beside_workers(jobs, helpers, threads, native, flush_denormal, on_row, work) -> None:
    """This thread computes cases while one feeder thread per worker hands that worker its
    next case the moment it finishes one. One case per worker in the pool at a time (the
    rest stay in `todo`), so a stopped sweep leaves nothing queued in a worker's pipe."""
    import multiprocessing
    import queue
    import threading
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor
    ex = ProcessPoolExecutor(helpers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_init_worker,
                             initargs=(threads, native, flush_denormal, os.getpid()))
    todo, lock, stop, finished = deque(jobs), threading.Lock(), threading.Event(), queue.Queue()

    def take():
        with lock:
            return todo.popleft() if todo and not stop.is_set() else None

    def feed(fut):
        while fut is not None:
            try:
                finished.put((fut.result(), None))
            except BaseException as e:         # a worker's error, raised in this thread below
                finished.put((None, e))
                return
            job = take()
            try:
                fut = ex.submit(work, job) if job is not None else None
            except RuntimeError:                # shut down between take() and submit: stopped
                return

    def deliver(block: bool) -> None:
        while True:
            try:
                row, err = finished.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return
            if err is not None:
                raise err
            on_row(row)
            block = False

    feeders, done = [], False
    try:
        # submitted from this thread, so each worker is spawned by it (_die_with_parent's
        # signal follows the spawning thread)
        for _ in range(helpers):
            job = take()
            if job is not None:
                feeders.append(threading.Thread(target=feed, args=(ex.submit(work, job),),
                                                name="sweep-feeder", daemon=True))
        for t in feeders:
            t.start()
        while (job := take()) is not None:
            on_row(work(job))
            deliver(block=False)
        while any(t.is_alive() for t in feeders) or not finished.empty():
            deliver(block=True)
        # every case done: the idle workers exit (tearing down torch) while the caller goes
        # on to its report; the interpreter joins them before it exits
        ex.shutdown(wait=False)
        done = True
    finally:
        stop.set()
        if not done:                           # stopped: wait out the cases in flight
            ex.shutdown(wait=True, cancel_futures=True)
        for t in feeders:
            if t.ident is not None:             # started (a failed setup starts none)
                t.join()


def manifest_of(grid, k: int, n: int) -> dict:
    return {"format": FORMAT, "schema_version": SCHEMA, "name": grid.name,
            "grid_file": os.path.basename(grid.path), "grid": grid.body, "files": grid.files,
            "grid_sha256": grid.sha256, "shard": f"{k}/{n}", "cases": len(grid.cases),
            "case_ids": [c.id for c in grid.cases]}


def claim(out: str, manifest: dict) -> None:
    """DIR/sweep.json: written on the first run, checked on every later one (a resume)."""
    from ladder.engine.atomic import write_all
    from ladder.sweep.report import read_manifest
    path = os.path.join(out, "sweep.json")
    if os.path.exists(path):
        old = read_manifest(out)
        for field in ("grid_sha256", "shard"):
            if old.get(field) != manifest[field]:
                raise SweepError(f"--out {out}: holds a sweep of {field} {old.get(field)} "
                                 f"({old.get('grid_file')}), this one is {manifest[field]} "
                                 f"({manifest['grid_file']}); give another --out, or the "
                                 f"same grid and shard to resume")
        return
    os.makedirs(os.path.join(out, "cases"), exist_ok=True)
    write_all({path: json.dumps(manifest, indent=1) + "\n"})


def cmd_sweep(args, out=print) -> int:
    from ladder.sweep import report as sweep_report
    if args.merge is not None:
        return sweep_report.cmd_merge(args, out)
    stream = sys.stderr
    grid = load_grid(args.grid)
    k, n = parse_shard(args.shard or "1/1")
    validate_cases(grid)
    mine = shard_cases(grid.cases, k, n)
    if args.dry_run:
        out(f"sweep {grid.name}: {len(grid.cases)} cases (grid sha256 {grid.sha256[:16]}), "
            f"shard {k}/{n}: {len(mine)}; every case's flags pass the run checks")
        for c in mine:
            out(f"{c.id}  python -m ladder run {' '.join(run_argv(c, None))}")
        return 0
    manifest = manifest_of(grid, k, n)
    claim(args.out, manifest)
    from ladder.sweep.row import read_row
    rows = {}
    for c in mine:
        rows[c.id], why = read_row(args.out, c)
        if why:                             # a row the report could not read: run it again
            stream.write(f"sweep: {why}; case {c.id} is not done, running it again\n")
    todo = [c for c in mine if rows[c.id] is None]
    threads = threads_per_worker(args)
    native = any(c.settings.get("backend") == "native" for c in todo)
    stream.write(f"sweep {grid.name}: {len(grid.cases)} cases, shard {k}/{n}: {len(mine)}, "
                 f"{len(mine) - len(todo)} done before, running {len(todo)} with -j "
                 f"{args.jobs} x {threads} thread{'s' * (threads != 1)}\n")
    progress = sweep_report.Progress(len(mine), len(mine) - len(todo), stream)

    def finished(row):
        rows[row["id"]] = row
        progress(row)
    try:
        run_cases(jobs_for(todo, args.out, grid.base, args.archives), args.jobs, threads,
                  native, finished)
    except KeyboardInterrupt:
        stream.write(f"sweep: interrupted; {progress.done} of {len(mine)} cases have results; "
                     f"the same command resumes\n")
        return 130
    except BrokenExecutor as e:             # a worker killed (out of memory, a signal)
        stream.write(f"error: a sweep worker died ({e}); {progress.done} of {len(mine)} "
                     f"cases have results; the same command resumes the rest\n")
        return 2
    ran = [r for r in rows.values() if r is not None]
    paths = sweep_report.write_report(args.out, manifest, ran, [c.id for c in mine])
    return sweep_report.summarize(manifest, ran, [c.id for c in mine], paths, out,
                                  ran_now=[c.id for c in todo])
