"""`python -m ladder shrink`: a divergence shrunk to its smallest reproducer, handed back as a
pytest file.

Takes what `run` takes (our port with --backend/--weights/--decode, or --port module:factory;
--plant FAULT) or a sweep's case (--from-sweep DIR CASE), finds the divergence the unshrunk
run shows (or the one --point / --verdict name), and searches for the smallest schedule that
still shows it (ladder/engine/shrink.py says how). Each candidate is one ordinary comparison
(`judge`, as `ladder_check` runs it), under --max-memory and --max-time. With --out DIR it
writes DIR/test_shrunk_divergence.py (the plugin's `ladder_check` on the schedule),
DIR/pytest.ini (the model and port flags) and DIR/README.md; nothing is written when the
search fails (no divergence to keep).
"""
from __future__ import annotations

import argparse
import math
import os
import shlex
import sys

from ladder.engine.shrink import Divergence, Schedule, Search
from ladder.sides.model_input import LadderInputError

TEST_FILE = "test_shrunk_divergence.py"


def _divergence(verdict) -> Divergence | None:
    if verdict.passed:
        return None
    loc = verdict.location
    first = loc.first if loc is not None else verdict.cmp.first
    err = first.first_bad_error
    return Divergence(first.point, (loc.split or "") if loc is not None else "", first.step,
                      first.first_bad_pos, math.inf if math.isnan(err) else err)


def sub_params(params: dict, cfg, k: int) -> tuple:
    """(params, cfg) of the model's first k layers: per-layer tensors (a leading L axis)
    sliced, the Engram sites of those layers kept in their order, everything else as is."""
    import dataclasses
    from reference.params import BLOCK
    L = cfg.num_layers
    sites = [s for s, layer in enumerate(cfg.engram_layers) if layer < k]
    sub = dataclasses.replace(cfg, num_layers=k,
                              engram_layers=tuple(cfg.engram_layers[s] for s in sites))
    out = {}
    for name, t in params.items():
        if name.startswith("engrams_"):
            site, _, rest = name[len("engrams_"):].partition("/")
            if int(site) in sites:
                out[f"engrams_{sites.index(int(site))}/{rest}"] = t
        elif (name.startswith(BLOCK) or name.startswith("stack/mhc_")) and t.shape[:1] == (L,):
            out[name] = t[:k].clone()
        else:
            out[name] = t
    return out, sub


class Models:
    """The model under test and its sub-models of fewer layers, each built once, from a
    parameter file of its own (so that the reproducer can name the same file)."""

    def __init__(self, args, tmp: str):
        from ladder.sides.judge import ModelUnderTest
        self.args, self.tmp = args, tmp
        self.full = ModelUnderTest.build(preset=args.preset, seed=args.seed, params=args.params,
                                         cact=args.cact, weights=args.weights,
                                         bits_map=args.bits_map, max_memory=args.max_memory)
        self.built = {0: self.full, self.full.cfg.num_layers: self.full}
        self.files = {}

    def get(self, k: int):
        if k not in self.built:
            from ladder.sides.judge import ModelUnderTest
            from reference.params import save_params
            params, cfg = sub_params(self.full.params, self.full.cfg, k)
            path = os.path.join(self.tmp, f"layers{k}.safetensors")
            save_params(path, params, cfg)
            self.files[k] = path
            self.built[k] = ModelUnderTest.build(params=path, weights=self.args.weights,
                                                 bits_map=self.args.bits_map,
                                                 max_memory=self.args.max_memory)
        return self.built[k]


def checker(args, models, planted_path: bool):
    """schedule -> the Divergence it shows (None when every point passes)."""
    from ladder.sides.capture import PathError
    from ladder.sides.ports import PortLoadError
    from ladder.sides.judge import judge

    def check(s: Schedule):
        model = models.get(s.layers)
        prec = getattr(args, "port_precision", None)
        port = args.port if args.port else model.our_port(args.backend, args.decode,
                                                          args.device, precision=prec)
        kw = {} if args.port else {"window": s.window}
        try:
            v = judge(port, model, rules=args.rules, tokens=list(s.tokens),
                      prompt_len=s.prompt_len, precision=prec,
                      check_plain=planted_path or not args.no_check_plain, **kw)
        except PathError as e:
            return Divergence(f"{e.path}:{e.point}", "path", e.step, e.position, math.inf)
        except PortLoadError as e:
            # a port whose factory assumes its full depth cannot be built on fewer layers:
            # that candidate cannot show the divergence (said after the search), any other
            # failure is the port's and ends the run
            if s.layers in (0, models.full.cfg.num_layers):
                raise
            check.skipped.append((s.layers, str(e).splitlines()[0][:200]))
            return None
        return _divergence(v)
    check.skipped = []
    return check


def _from_sweep(args, out):
    """The run flags of a sweep's case (its result.json's `run`), parsed as `run` parses them."""
    from ladder.cli.parser import build_parser
    from ladder.sweep.row import read_result
    d, case = args.from_sweep
    cases = os.path.join(d, "cases")
    names = sorted(n for n in (os.listdir(cases) if os.path.isdir(cases) else [])
                   if n == case or n.startswith(case + "-"))
    if len(names) != 1:
        raise LadderInputError(f"--from-sweep {d!r} {case!r}: " + (
            f"no case {case!r} under {cases!r}" if not names else
            f"{len(names)} cases match ({', '.join(names[:4])}); give the full id"))
    row = read_result(os.path.join(cases, names[0], "result.json"))
    run = row.get("run") if isinstance(row, dict) else None
    if not isinstance(run, str):
        raise LadderInputError(f"--from-sweep: {names[0]}/result.json field run={run!r} is not "
                               f"a `python -m ladder run` command")
    _only_own_flags(args)
    argv = _run_argv(run, f"--from-sweep: {names[0]}/result.json field run")
    out(f"from sweep case {names[0]}: {run}")
    new = build_parser().parse_args(["shrink", *argv])
    for k in ("max_time", "out", "point", "verdict", "force"):
        setattr(new, k, getattr(args, k))
    if args.max_memory is not None:          # shrink's own bound, else the row's
        new.max_memory = args.max_memory
    new.from_sweep = None
    return new


# shrink's own flags, which --from-sweep keeps from the command line (the case's `run` gives
# every other one)
_KEPT = ("max_time", "out", "point", "verdict", "force", "max_memory", "from_sweep", "cmd")


def _only_own_flags(args) -> None:
    """With --from-sweep the case's `run` string sets the run flags: one given on the command
    line too would be dropped in silence, so it is refused, naming it."""
    from ladder.cli.parser import build_parser
    defaults = vars(build_parser().parse_args(["shrink"]))
    given = [k for k, v in vars(args).items()
             if k not in _KEPT and k in defaults and v != defaults[k]]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise LadderInputError(f"shrink --from-sweep: {flag} {getattr(args, given[0])!r} is a "
                               f"run flag, and the case's result.json `run` sets the run flags; "
                               f"beside --from-sweep give only --point, --verdict, --out, "
                               f"--force, --max-time, --max-memory")


# What a sweep row's `run` may hold: the command `ladder sweep` wrote, a few dozen flags. A
# bound far above that keeps argparse (quadratic in the flag count) from running for minutes.
MAX_RUN_CHARS, MAX_RUN_FLAGS = 4096, 64
# shrink's own choices; a row's run string that sets them would be silently overridden.
_SHRINK_OWN = ("--point", "--verdict", "--out", "--force", "--from-sweep", "--max-time",
               "--help", "-h")


def _run_argv(run: str, field: str) -> list:
    """The flags after `python -m ladder run` in a sweep row's command, or LadderInputError
    naming the field: unparsable quoting, too long, not exactly `run`, or a flag shrink sets."""
    if len(run) > MAX_RUN_CHARS:
        raise LadderInputError(f"{field} holds {len(run)} characters; a sweep's run command "
                               f"holds at most {MAX_RUN_CHARS}")
    try:
        words = shlex.split(run)
    except ValueError as e:                  # an unbalanced quote, a trailing backslash
        raise LadderInputError(f"{field}={run[:80]!r} does not parse as a shell command: "
                               f"{e}") from None
    if words[:4] != ["python", "-m", "ladder", "run"]:
        raise LadderInputError(f"{field}={run[:80]!r} is not a `python -m ladder run` command")
    argv = words[4:]
    if len(argv) > MAX_RUN_FLAGS:
        raise LadderInputError(f"{field} holds {len(argv)} arguments; a sweep's run command "
                               f"holds at most {MAX_RUN_FLAGS}")
    longs = _shrink_long_flags()
    for word in argv:
        flag = word.split("=", 1)[0]
        # argparse takes any unambiguous prefix of a long flag (--ou is --out, --h is --help)
        # and reads -hX as -h then X, so a word is resolved as the shrink parser will read it
        if flag.startswith("--"):
            hit = [flag] if flag in longs else [f for f in longs if f.startswith(flag)]
            hit = hit if len(hit) == 1 else []
        else:
            hit = ["-h"] if flag.startswith("-h") else []
        if hit and hit[0] in _SHRINK_OWN:
            raise LadderInputError(f"{field} sets {hit[0]} ({word[:40]!r}): shrink's own flag, "
                                   f"not a run flag; give it to shrink itself")
    return argv


def _shrink_long_flags() -> list:
    """Every long option the shrink parser knows (the row's run flags are parsed by it)."""
    from ladder.cli.parser import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "cmd").choices["shrink"]
    return [o for a in sub._actions for o in a.option_strings if o.startswith("--")]


def cmd_shrink(args, out=print) -> int:
    if args.from_sweep:
        from ladder.cli.args import check as check_args
        from ladder.cli.commands import with_fault
        from ladder.sides.model_input import computing
        args = _from_sweep(args, out)
        check_args(args)
        with computing(args):           # the case's port decides, as `shrink --port` would
            if args.plant:              # the case's fault, planted as `run` plants it
                return with_fault(_shrink, args, out)
            return _shrink(args, out)
    return _shrink(args, out)


def _shrink(args, out) -> int:
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        return _search(args, out, tmp)


def check_out(path: str, force: bool = False) -> None:
    """Refuse an --out that cannot take the reproducer, before the first candidate runs: not a
    directory (a file, a link, a device), under a file, a name past the filesystem's limit, or
    one of the files it would write already there (replaced only with --force, a link never)."""
    where = f"shrink --out {path[:120]!r}"
    if os.path.islink(path) or os.path.lexists(path) and not os.path.isdir(path):
        raise LadderInputError(f"{where}: exists and is not a directory (a link or a file); "
                               f"name a new or existing directory")
    from ladder.cli.args import name_lengths
    up = name_lengths(where, os.path.dirname(os.path.abspath(path)))
    name_lengths(where, path)
    if not os.path.isdir(up):
        raise LadderInputError(f"{where}: {up} is not a directory, so nothing can be made "
                               f"under it")
    if os.path.isdir(path):
        for name in (TEST_FILE, "pytest.ini", "README.md", "model.safetensors"):
            f = os.path.join(path, name)
            if os.path.islink(f):
                raise LadderInputError(f"{where}: {name} there is a link; shrink never writes "
                                       f"through or over a link")
            if os.path.lexists(f) and not os.path.isfile(f):
                raise LadderInputError(f"{where}: {name} there is not a regular file (a "
                                       f"directory?); shrink replaces only its own files")
            if os.path.lexists(f) and not force:
                raise LadderInputError(f"{where}: {name} is already there; pass --force to "
                                       f"replace it, or name another directory")


def _search(args, out, tmp) -> int:
    from ladder.cli.args import window_range
    if args.out is not None:
        check_out(args.out, getattr(args, "force", False))
    if args.port and args.window is not None:
        raise LadderInputError(f"shrink --port {args.port} --window {args.window}: a protocol "
                               f"port is judged on its own make_state() in every candidate, so "
                               f"--window cannot reach it; drop --window")
    if args.port and args.plant:
        raise LadderInputError(f"shrink --port {args.port} --plant {args.plant}: a fault is "
                               f"planted in our port, not in --port's; shrink one or the other")
    for flag, value in (("--dump", args.dump), ("--fixture", args.fixture)):
        if value:
            raise LadderInputError(f"shrink {flag} {value}: a recording is one fixed schedule; "
                                   f"nothing can be re-run on a smaller one (shrink the port "
                                   f"that wrote it: --port module:factory, or our backends)")
    if args.model != "needle_v2":
        raise LadderInputError("shrink: --model attn_v41 runs the fixture's recorded calls; "
                               "there is no schedule of ours to shrink")
    from ladder.sides import path_faults
    models = Models(args, tmp)
    model = models.full
    path = path_faults.PATH_FAULTS.get(args.plant) if args.plant else None
    check = checker(args, models, path is not None)
    if args.point is not None:
        _check_point(args.point, model.cfg)
    tokens = model.tokens(args.prompt_len + args.steps)
    made = model.our_port(args.backend, args.decode, args.device).make_state().window \
        if not args.port else None
    window = args.window if args.window is not None else (made if made is not None
                                                         else model.cfg.kv_window)
    # a .cact holds every layer's packed codes: no sub-model of it is built
    layers = range(0) if args.cact else range(1, model.cfg.num_layers)
    start = Schedule(tuple(tokens), args.prompt_len, window,
                     0 if args.cact else model.cfg.num_layers)
    lo, hi = window_range(model.cfg)
    windows = range(0, 0) if args.port else range(max(lo, 1), min(hi, window) + 1)
    progress = (lambda line: print(line, file=sys.stderr, flush=True))
    # --plant's fault is planted around this whole command (cli/main.py's with_fault)
    first = check(start)
    if first is None:
        out(f"shrink: no divergence on {start.describe()}: nothing to shrink (every "
            f"point passes its rule)")
        return 1
    keep = Divergence(args.point or first.point, first.verdict if args.verdict is None
                      else args.verdict, first.step, first.position, first.fraction)
    if not keep.same(first):
        out(f"shrink: the unshrunk run's first divergence is {first.describe()}, not "
            f"{keep.point} ({keep.verdict or 'no verdict'}): nothing to keep")
        return 1
    out(f"shrink: keeping {first.describe()}; start {start.describe()}")
    res = Search(check, keep, windows, args.max_time, progress, layers).run(start)
    out(f"smallest schedule: {res.best.describe()}")
    out(f"  tokens {list(res.best.tokens)}, prompt_len {res.best.prompt_len}")
    out(f"divergence: {res.divergence.describe()}")
    if check.skipped:
        depths = sorted({k for k, _ in check.skipped})
        out(f"note: {len(check.skipped)} candidate{'s' * (len(check.skipped) != 1)} of "
            f"{' or '.join(map(str, depths))} layers could not be built and were taken as not "
            f"showing it: {check.skipped[0][1]}")
    out(f"{res.ratio():.3g}x fewer positions ({len(start.tokens)} -> {len(res.best.tokens)}); "
        f"{res.tried} candidates in {res.seconds:.1f} s"
        + ("; stopped by --max-time (the best so far)" if res.timed_out else ""))
    if args.out:
        sub = res.best.layers if res.best.layers not in (0, model.cfg.num_layers) else None
        if sub:
            models.get(sub)                  # its parameter file, written once
        for p in write_reproducer(args, res, models.files.get(sub)):
            out(f"wrote {p}")
    return 0


def _check_point(point: str, cfg) -> None:
    """--point names a registry point of this model (L03.q), or a plain path's divergence as
    shrink prints it (prefill_batch:L00.x); anything else could never be kept."""
    from ladder.model.points import expected
    names = [n for n, _ in expected(cfg)]
    bare = point.split(":", 1)[1] if ":" in point else point
    if bare not in names:
        raise LadderInputError(f"--point {point[:60]!r}: not a point of this model "
                               f"({cfg.num_layers} layers; e.g. {names[1]}, L00.y, logits; "
                               f"`python -m ladder points` lists them)")


def pytest_flags(args, params_file=None) -> list:
    """The plugin's flags for the model and port the search ran on (`params_file`: the
    sub-model of fewer layers, written beside the test and named by the ini file's
    ladder_params key, so no flag names it)."""
    flags = []
    if params_file:
        args = argparse.Namespace(**{**vars(args), "preset": "tiny", "seed": 0,
                                     "params": None, "cact": None})
    for flag, value, default in (("--ladder-preset", args.preset, "tiny"),
                                 ("--ladder-seed", args.seed, 0),
                                 ("--ladder-params", args.params, None),
                                 ("--ladder-cact", args.cact, None),
                                 ("--ladder-weights", args.weights, None),
                                 ("--ladder-backend", args.backend, "torch"),
                                 ("--ladder-decode", args.decode, "eager"),
                                 ("--ladder-port", args.port, None)):
        if value != default and value is not None:
            v = os.path.abspath(value) if flag in ("--ladder-params", "--ladder-cact") else value
            flags += [flag, str(v)]
    return flags


def write_reproducer(args, res, sub_file=None) -> list:
    """DIR/test_shrunk_divergence.py, DIR/pytest.ini, DIR/README.md (all or none), and the
    sub-model's parameters (DIR/model.safetensors, copied from `sub_file`) when the search
    dropped layers."""
    from ladder.engine.atomic import write_all
    model_file = os.path.join(args.out, "model.safetensors") if sub_file is not None else None
    b, d = res.best, res.divergence
    window = "" if args.port else f", window={b.window}"
    plant = f" --ladder-plant {args.plant}" if args.plant else ""
    test = (f'"""The smallest schedule found by `python -m ladder shrink` that shows\n'
            f"{d.describe()}.\n\n"
            f"{res.best.describe()}; shrunk from {len(res.start.tokens)} positions in "
            f"{res.tried} candidates.\n"
            f'"""\nimport pytest\n\n\n'
            f"@pytest.mark.ladder(tokens={list(b.tokens)}, prompt_len={b.prompt_len}{window})\n"
            f"def test_shrunk_divergence(ladder_check):\n"
            f"    ladder_check()\n")
    # paths inside the directory are relative to it (pytest reads an ini path beside the
    # ini file), so the directory can be moved into another suite whole; a model file or
    # port module outside it is named absolutely
    flags = pytest_flags(args, model_file)
    ini = "[pytest]\n" + ("addopts = " + " ".join(shlex.quote(f) for f in flags) + "\n"
                          if flags else "")
    if model_file is not None:
        ini += "ladder_params = model.safetensors\n"
    if args.port:                   # where `module` of --port module:factory imported from
        ini += f"pythonpath = {os.getcwd()}\n"
    fails = f"python -m pytest .{plant}"
    readme = (f"In this directory, `{fails}` reproduces {d.point} "
              f"({d.verdict or 'first divergence'}) on {b.describe()}: it fails on the bug and "
              f"passes once it is fixed" + (f" (without --ladder-plant {args.plant})"
                                            if args.plant else "") +
              ". From elsewhere, give the directory's path in place of `.`; the files name "
              "nothing by this directory's path, so it can be moved whole.\n")
    os.makedirs(args.out, exist_ok=True)
    files = {os.path.join(args.out, TEST_FILE): test, os.path.join(args.out, "pytest.ini"): ini,
             os.path.join(args.out, "README.md"): readme}
    blobs = {p: t.encode() for p, t in files.items()}
    if sub_file is not None:
        with open(sub_file, "rb") as f:
            blobs[model_file] = f.read()
    write_all(blobs)
    return list(blobs)
