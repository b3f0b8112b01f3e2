"""Command-line values checked before any work, in the words of the command line.

`check(args)` runs before a command starts: every flag that can be judged on its own (files
exist and are what the flag wants, numbers in range, the backend can run here, the report
and fixture paths are writable or found). `check_model(args, cfg)` runs once the model's
geometry is known and before anything is printed or computed: the limits that depend on it
(--window, --prompt-len + --steps). Each message names the flag, the value, what is allowed
and what to do; cli.py maps them to exit status 2.
"""
from __future__ import annotations

import importlib.util
import os
import struct
import tempfile

from ladder.sides import fixtures

SAFETENSORS_HINT = "a safetensors parameter file (save_params writes them)"


def _fail(msg: str):
    from ladder.sides.model_input import LadderInputError       # the CLI's own error class (exit status 2)
    raise LadderInputError(msg)


def _head(path: str, n: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def looks_like_cact(path: str) -> bool:
    """Does the file start with the .cact tag? (The CLI and the plugin sniff alike.)"""
    from reference.cact import TAG
    head = _head(path, 4)
    return len(head) == 4 and struct.unpack("<I", head)[0] == TAG


def looks_like_safetensors(path: str) -> bool:
    """Does the file start as safetensors does (an 8-byte length, then '{')?"""
    head = _head(path, 9)
    return len(head) == 9 and head[8:9] == b"{"


def input_file(flag: str, path: str, what: str) -> None:
    """A file the flag reads: it must exist, be a regular file and be readable."""
    if not os.path.exists(path):
        _fail(f"{flag} {path}: no such file (give the path to {what})")
    if not os.path.isfile(path):
        _fail(f"{flag} {path}: not a regular file (give the path to {what})")
    if not os.access(path, os.R_OK):
        _fail(f"{flag} {path}: not readable (check its permissions)")


def _limit(path: str, name: str, default: int) -> int:
    try:
        return int(os.pathconf(path, name))
    except (OSError, ValueError, AttributeError):       # not every system says
        return default


def name_lengths(where: str, path: str) -> str:
    """The nearest existing directory above `path`, once every name still to be created fits
    the file system there. exists() is False for a name too long to look up, so the names are
    measured here: a mkdir failing with ENAMETOOLONG after the whole run is too late."""
    probe, missing = os.path.abspath(path), []
    while not os.path.lexists(probe):
        missing.append(os.path.basename(probe))
        probe = os.path.dirname(probe)
    up = probe if os.path.isdir(probe) else os.path.dirname(probe)
    name_max = _limit(up, "PC_NAME_MAX", 255)
    for name in missing:
        if len(os.fsencode(name)) > name_max:
            _fail(f"{where}: a name of {len(os.fsencode(name))} bytes; this file system takes "
                  f"at most {name_max} per name")
    path_max = _limit(up, "PC_PATH_MAX", 4096)
    if len(os.fsencode(os.path.abspath(path))) > path_max - 512:     # room for the files
        _fail(f"{where}: a path of {len(os.fsencode(os.path.abspath(path)))} bytes; at most "
              f"{path_max - 512} (this file system's {path_max}, less room for the files "
              f"written under it)")
    return probe


def writable_dir(flag: str, path: str, shown: str | None = None) -> None:
    """A directory the command will create or write into: an existing directory, or a path
    whose nearest existing parent is a writable directory."""
    shown = path if shown is None else shown
    if os.path.exists(path) and not os.path.isdir(path):
        _fail(f"{flag} {shown}: exists and is not a directory (give a directory to write to)")
    probe = name_lengths(f"{flag} {shown}", path)
    # A real write, not os.access: root passes every permission bit, yet /proc refuses.
    try:
        if not os.path.isdir(probe):
            raise NotADirectoryError(0, "not a directory")
        fd, tmp = tempfile.mkstemp(prefix=".write-check-", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        _fail(f"{flag} {shown}: cannot write under {probe} ({e.strerror or e}); choose a "
              f"writable directory")


def _count(flag: str, value: int, lo: int, what: str) -> None:
    if value < lo:
        _fail(f"{flag} {value}: must be >= {lo} ({what})")


def window_range(cfg) -> tuple:
    """(lo, hi) of --window: the port steps on make_state()'s ring, kv_window slots (the whole
    max_seq_len for a full-causal model), and a window cannot be wider than its ring."""
    return (1, cfg.kv_window) if cfg.kv_window else (0, cfg.max_seq_len)


def _model_files(args) -> None:
    if args.params and args.cact:
        _fail(f"--params {args.params} and --cact {args.cact}: give one of them, not both")
    if args.params:
        input_file("--params", args.params, SAFETENSORS_HINT)
        if looks_like_cact(args.params):
            _fail(f"--params {args.params} is a .cact checkpoint; use --cact {args.params}")
    if args.cact:
        input_file("--cact", args.cact, "a .cact checkpoint")
        if looks_like_safetensors(args.cact):
            _fail(f"--cact {args.cact} is a safetensors file; use --params {args.cact}")
        if not looks_like_cact(args.cact):
            _fail(f"--cact {args.cact}: not a .cact file (its first 4 bytes are not the .cact "
                  f"tag); --cact takes a checkpoint written by cactus-needle or write_cact")


def _schedule_flags(args) -> None:
    _count("--prompt-len", args.prompt_len, 1, "the prompt needs at least one token")
    _count("--steps", args.steps, 0, "the number of one-token decode steps")
    if args.window is not None and args.window < 0:
        _fail(f"--window {args.window}: must be >= 0 (0: the KV budget, kv_budget positions; drop --window for the "
              f"model's own window)")
    if not -2 ** 63 <= args.seed < 2 ** 64:
        _fail(f"--seed {args.seed}: outside -2**63..2**64-1, the range torch seeds take")


def _port_timeout(args) -> None:
    t = getattr(args, "port_timeout", None)
    if t is None:
        return
    if not getattr(args, "port", None):
        _fail(f"--port-timeout {t:g}: bounds an in-process --port's calls; give --port or drop "
              f"--port-timeout")
    if not (0 < t <= 86400):          # nan fails both comparisons
        _fail(f"--port-timeout {t!r}: seconds in (0, 86400]")


# Where our port computes below float32, by (backend, decode): "any" precision, or "kv=act" (the
# KV cache in the activation dtype). port/backend.py `runs_precision` is the rule; this restates
# it so a refusal comes before torch is imported (tests/port/test_fused_precision.py holds them equal).
BELOW_FLOAT32 = {("torch", "eager"): "any", ("triton", "eager"): "kv=act",
                 ("triton", "graph"): "kv=act"}


def _port_precision(args) -> None:
    spec = getattr(args, "port_precision", None)
    if spec is None:
        return
    from ladder.model.precision import Precision, PrecisionError, weights_contradiction
    try:
        prec = Precision.parse(spec, f"--port-precision {spec!r}")
    except PrecisionError as e:
        _fail(str(e))
    if getattr(args, "model", "needle_v2") != "needle_v2":
        _fail(f"--port-precision {spec}: judges needle v2 sides; --model {args.model} has its "
              f"own bf16 rules")
    if args.cmd == "compare" and getattr(args, "a", None) == "reference":
        _fail(f"--port-precision {spec}: declares the candidate's precision (the first side); "
              f"here it is the reference, which is float32")
    ours = not (getattr(args, "port", None) or getattr(args, "dump", None)) and (
        args.cmd not in ("compare", "dump") or "torch" in (getattr(args, "a", None),
                                                           getattr(args, "b", None),
                                                           getattr(args, "side", None)))
    form = getattr(args, "weights", None) or ("cq" if getattr(args, "cact", None) else "dense")
    why = ours and weights_contradiction(spec, prec, form, "--weights")
    if why:
        _fail(f"--port-precision {spec}: {why}")
    where = BELOW_FLOAT32.get((getattr(args, "backend", "torch"), getattr(args, "decode", "eager")))
    if ours and not prec.is_float32 and not (where == "any" or
                                             (where and prec.kv == prec.activations)):
        _fail(f"--port-precision {spec}: our port runs below float32 on --backend torch "
              f"--decode eager, or on --backend triton with the KV cache in the activation "
              f"dtype (given --backend {getattr(args, 'backend', 'torch')} --decode "
              f"{getattr(args, 'decode', 'eager')}, kv {prec.kv})")


def _port_flags(args) -> None:
    if args.weights not in (None, "dense", "cq"):
        _fail(f"--weights {args.weights}: must be dense or cq (default: cq for --cact, else "
              f"dense)")
    if args.weights == "cq" or args.cact is None:
        try:
            from reference.cq import parse_bits_map
            parse_bits_map(args.bits_map)
        except ValueError as e:
            _fail(f"--bits-map {args.bits_map}: {e} (e.g. embedding=4,mhc=4,default=2)")
    import torch
    try:
        dev = torch.device(args.device)
    except RuntimeError as e:
        _fail(f"--device {args.device}: not a device torch knows (device={args.device!r}: "
              f"{e}); e.g. cpu, cuda, cuda:1")
    if dev.type == "cuda" and not torch.cuda.is_available():
        _fail(f"--device {args.device}: torch.cuda.is_available() is False here (torch "
              f"{torch.__version__}); use --device cpu")
    _device_kind(args)
    from port.backend import backend_class
    cls = backend_class(args.backend)
    if cls.native:
        if not cls.runs_on(dev.type, args.decode):
            _fail(f"--backend native runs on the CPU, eagerly (got --device {args.device} "
                  f"--decode {args.decode}); drop those flags, or use --backend torch")
        from kernels.native import unavailable_reason
        why = unavailable_reason()
        if why:
            _fail(f"--backend native cannot run here: {why.splitlines()[0]}; use "
                  f"--backend torch")
    if cls.needs_triton and importlib.util.find_spec("triton") is None:
        _fail("--backend triton: Triton is not installed (pip install 'needle-parity[gpu]'); "
              "use --backend torch")


def _fixture_flag(args) -> None:
    if args.fixture:
        stem = fixtures.find_stem(args.fixture)
        if stem is None:
            bare = fixtures.bare_stem(args.fixture)
            name = os.path.basename(bare)
            where = f", nor {name}.json + {name}.safetensors in {fixtures.REPO_FIXTURES}" \
                if fixtures.REPO_FIXTURES else " (this installed copy has no tests/fixtures/)"
            _fail(f"--fixture {args.fixture}: no {bare}.json + {bare}.safetensors{where}; "
                  f"fixtures live in the repository's tests/fixtures/: "
                  f"give the path to one, or make one with `python -m ladder regen --out STEM`")
        args.fixture = stem


def _report_flags(args) -> None:
    if not args.out.strip():
        _fail(f"--out {args.out!r}: empty; give the directory to write the report into "
              f"(default ladder-report)")
    writable_dir("--out", args.out)
    if not args.stem or args.stem in (".", "..") or os.sep in args.stem or \
            (os.altsep and os.altsep in args.stem):
        _fail(f"--stem {args.stem!r}: must be a plain file name (the report is written as "
              f"--out/STEM.md, .csv, .html)")
    from ladder.engine.plot import have_matplotlib       # the test `--plot auto` decides by, too
    if args.plot == "png" and not have_matplotlib():
        _fail("--plot png needs matplotlib, which is not installed: pip install "
              "'needle-parity[plot]', or use --plot svg (no dependency)")


def _regen_out(args, exts: tuple) -> bool:
    """--check needs the files to compare; a write needs a writable directory. True: writing."""
    if args.check:
        missing = [p for p in (f"{args.out}{e}" for e in exts) if not os.path.isfile(p)]
        if missing:
            _fail(f"regen --check --out {args.out}: {missing[0]} does not exist, so there is "
                  f"nothing to compare (drop --check to write it)")
        return False
    writable_dir("--out", os.path.dirname(os.path.abspath(args.out)), shown=args.out)
    return True


def _regen_flags(args) -> None:
    if getattr(args, "format", "needle-parity") == "needle-rs":
        if not args.out.strip() or os.path.basename(args.out) in ("", ".", ".."):
            _fail(f"--out {args.out!r}: must name a fixture stem, written as STEM.json and "
                  f"STEM.f32 (e.g. --out /tmp/v2)")
        _regen_out(args, (".json", ".f32"))
        return
    if getattr(args, "prompt", None) is not None:
        _fail("regen --prompt: only with --format needle-rs (our fixture runs seeded token ids)")
    if args.out is None:
        if fixtures.REPO_FIXTURES is None:
            _fail("regen: this installed copy has no tests/fixtures/ to write to; give "
                  "--out STEM (or run from a checkout of the repository)")
        args.out = fixtures.default_stem()
    if not args.out.strip() or os.path.basename(args.out) in ("", ".", ".."):
        # '' would write the hidden files .json and .safetensors in the working directory
        _fail(f"--out {args.out!r}: must name a fixture stem, written as STEM.json and "
              f"STEM.safetensors (e.g. --out /tmp/fx); drop --out for the checkout's own")
    if _regen_out(args, (".json", ".safetensors")):
        committed = fixtures.default_stem()
        if committed and os.path.abspath(args.out) == committed and not args.force:
            from ladder.sides.model_input import DEFAULT_PROMPT, DEFAULT_STEPS
            other = [f"{flag} {v}" for flag, v, default in (
                ("--preset", args.preset, "tiny"), ("--params", args.params, None),
                ("--cact", args.cact, None), ("--seed", args.seed, 0),
                ("--prompt-len", args.prompt_len, DEFAULT_PROMPT),
                ("--steps", args.steps, DEFAULT_STEPS), ("--window", args.window, None))
                if v != default]
            if other:
                _fail(f"regen {' '.join(other)}: would overwrite the committed fixture "
                      f"{committed}.json + .safetensors, made from the default inputs, with "
                      f"other ones; give --out STEM for a new fixture, or --force to "
                      f"overwrite it")


def _empty_paths(args) -> None:
    """A path flag given as '' (or blanks): refused, not read as absent (an empty --params
    would silently run the preset, an empty --fixture the default fixture)."""
    for flag, dest in (("--params", "params"), ("--cact", "cact"), ("--fixture", "fixture"),
                       ("--rules", "rules")):
        v = getattr(args, dest, None)
        if isinstance(v, str) and not v.strip():
            _fail(f"{flag} {v!r}: empty path; give a file, or drop {flag}")
    for flag, dest, what in (("--plant", "plant", "name a fault (--list-faults lists them)"),
                             ("--port", "port", "give module:factory"),
                             ("--dump", "dump", "give a recording's path")):
        v = getattr(args, dest, None)
        if isinstance(v, str) and not v.strip():
            # '' would read as "not given": a run without the fault (or port) it was asked for
            _fail(f"{flag} {v!r}: empty; {what}, or drop {flag}")


def _device_kind(args) -> None:
    """A device torch knows but the port does not run on (meta, xpu, mps...) or a CUDA index
    past the devices here: refused now, not after the run has started."""
    import torch
    dev = torch.device(args.device)
    if dev.type not in ("cpu", "cuda"):
        _fail(f"--device {args.device}: device type {dev.type!r} is not one the port runs on "
              f"(cpu, cuda, cuda:N)")
    if dev.type == "cuda" and dev.index is not None and torch.cuda.is_available() and \
            dev.index >= torch.cuda.device_count():
        _fail(f"--device {args.device}: index {dev.index} outside 0.."
              f"{torch.cuda.device_count() - 1}, the CUDA devices here")


def check(args) -> None:
    """Every flag that can be judged before the model is loaded."""
    if args.cmd == "sweep":                 # ladder/cli/main.py checks its flags (ladder/sweep/)
        return
    _empty_paths(args)
    if getattr(args, "rules", None):
        input_file("--rules", args.rules, "a .toml or .json rules file (see `ladder rules`)")
    if args.cmd == "rules":
        return
    _model_files(args)
    if args.cmd == "points":
        if args.params and args.cact:
            _fail("give one of --params and --cact, not both")
        return
    _schedule_flags(args)
    if args.cmd == "regen":
        _regen_flags(args)
        return
    _port_precision(args)       # before _port_flags: a refused pair never builds the C step
    _port_flags(args)
    _port_timeout(args)
    if args.cmd in ("compare", "dump"):
        if args.cmd == "dump":
            writable_dir("--out", os.path.dirname(os.path.abspath(args.out)) if args.out
                         else "", shown=args.out)
            if not args.out or os.path.isdir(args.out):
                _fail(f"dump --out {args.out!r}: must name a file (the archive, .safetensors)")
        return
    if getattr(args, "model", "needle_v2") == "needle_v2":   # attn_v41 reads its own fixture
        _fixture_flag(args)
    if args.cmd == "report":
        _report_flags(args)


def check_model(args, cfg) -> None:
    """The limits that depend on the model's geometry; before anything is printed."""
    if args.window is not None and args.cmd != "regen":
        lo, hi = window_range(cfg)
        if not lo <= args.window <= hi:
            full = "" if lo == 0 else (f"; 0 (the KV budget, {cfg.kv_budget} positions) "
                                       f"needs a model whose kv_window is 0")
            _fail(f"--window {args.window}: must lie in {lo}..{hi}, the port's KV ring "
                  f"(make_state(): kv_window={cfg.kv_window}){full}; drop --window to run "
                  f"the model's own window")
    n = args.prompt_len + args.steps
    if not getattr(args, "fixture", None) and n > cfg.max_seq_len:
        _fail(f"--prompt-len {args.prompt_len} + --steps {args.steps} = {n} positions: "
              f"exceeds the model's max_seq_len={cfg.max_seq_len}; lower --steps")


def schedule_note(n: int, ring: int, window: int) -> str:
    """The run header's word on the port's KV ring (`ring` slots, attention `window`): whether
    these positions make it wrap."""
    if not window:
        return ""
    if n > ring:
        return f", the ring ({ring} slots, window {window}) wraps at position {ring}"
    return (f"; note: {n} positions fit in the ring of {ring} slots (window {window}), so the "
            f"ring never wraps (raise --steps to test wrapping)")
