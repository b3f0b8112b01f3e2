"""The plugin's --ladder-* values, checked in pytest_configure before any test runs.

A bad value, or a pair of values that `python -m ladder` refuses (ladder/cli/args.py), is a
pytest.UsageError (exit status 4) naming the flag, the value and what is allowed: never a
traceback repeated in every test. What is checked:

    every value      given as '' (or blanks): refused, not read as "not given"
    --ladder-seed    ASCII decimal digits (`1_0`, ' 5', non-ASCII digits refused), in
                     -2**63..2**64-1, the range torch seeds take
    --ladder-precision  ladder/model/precision.py's syntax; for our port (no --ladder-port or
                     --ladder-dump): a backend and decode mode that compute at it
                     (port/backend.py `runs_precision`), and weights it does not contradict
                     (weights=cq needs CQ weights; a CQ model's weights are its codes)
    --ladder-device  a device torch knows, of a type the port runs on (cpu, cuda), present here
    --ladder-backend native: CPU and eager, and the C step builds here; triton: installed
    --ladder-plant   a known fault that lives in this backend, decode mode and weight form
    --ladder-params, --ladder-cact, --ladder-rules (or the ini key), --ladder-dump: files that
                     exist and are what the flag reads (a rules file is parsed); one of params
                     and cact
    --ladder-out     a directory that can be written (or created)
    --ladder-port    module:factory resolves (ladder/sides/ports.py)

Nothing here imports torch while every option keeps its default: the plugin is installed in
suites that never use it. Under pytest-xdist the controller checks; its workers only read.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re

import pytest

SEED_RANGE = (-2 ** 63, 2 ** 64 - 1)


def shown(v) -> str:
    """A value as a message shows it: its repr, cut at 40 characters with its length."""
    s = str(v)
    return repr(s) if len(s) <= 60 else f"{s[:40]!r}... ({len(s)} characters)"


def seed(text):
    """--ladder-seed's type (argparse: a refusal is pytest's usage error)."""
    if not isinstance(text, str):
        return text                                 # the default
    if not re.fullmatch(r"[+-]?[0-9]{1,20}", text):
        raise argparse.ArgumentTypeError(
            f"{shown(text)}: give an integer in ASCII digits (e.g. 0, 3, -1), "
            f"in -2**63..2**64-1")
    v = int(text)
    if not SEED_RANGE[0] <= v <= SEED_RANGE[1]:
        raise argparse.ArgumentTypeError(f"{shown(text)}: outside -2**63..2**64-1, the range "
                                         f"torch seeds take")
    return v


INI_KEYS = ("port", "rules", "params", "cact")      # ladder_<name> in the ini file


def opt(config, name):
    """A --ladder-* value; the ini keys stand in for --ladder-port, -rules, -params and -cact
    (a relative path in the ini file is read beside it, as pytest reads ini paths: a
    reproducer directory moves whole). --ladder-params or --ladder-cact on the command line
    sets the model, and then neither ini file key is read."""
    v = config.getoption(f"--ladder-{name}")
    if name in ("params", "cact") and (config.getoption("--ladder-params") or
                                       config.getoption("--ladder-cact")):
        return v
    if v is None and name in INI_KEYS:
        v = config.getini(f"ladder_{name}") or None
        if v and name != "port" and not os.path.isabs(v) and config.inipath is not None:
            v = os.path.join(os.path.dirname(str(config.inipath)), v)
    return v


def ours(config) -> bool:
    """Is the port under test port.V2Model (the one --ladder-backend & co. configure)?"""
    return not (opt(config, "port") or opt(config, "dump"))


def weight_form(config) -> str:
    return opt(config, "weights") or ("cq" if opt(config, "cact") else "dense")


def run_precision(config):
    """--ladder-precision as a Precision (None when not given), as our port runs it: a CQ
    model's weights are its codes whatever the declaration says of them."""
    spec = config.getoption("--ladder-precision")
    if spec is None:
        return None
    from ladder.model.precision import Precision
    prec = Precision.parse(spec)
    if ours(config) and weight_form(config) == "cq" and prec.weights != "cq":
        prec = Precision(prec.activations, "cq", prec.kv)
    return prec


def _usage(msg: str):
    raise pytest.UsageError(msg)


def _cli_check(fn, *args) -> None:
    """One of ladder/cli/args.py's public checks, its refusal as a usage error."""
    from ladder.sides.model_input import LadderInputError
    try:
        fn(*args)
    except LadderInputError as e:
        raise pytest.UsageError(str(e)) from None


def check_options(config) -> None:
    """Every --ladder-* value and pair (the module docstring), before any test runs."""
    get = config.getoption
    for name in ("port", "dump", "plant", "params", "cact", "rules", "out", "device"):
        v = get(f"--ladder-{name}")
        if isinstance(v, str) and not v.strip():     # '' would read as "not given"
            _usage(f"--ladder-{name} {v!r}: empty; give a value or drop it")
    port, dump, plant = get("--ladder-port"), get("--ladder-dump"), get("--ladder-plant")
    if port and dump:
        _usage("--ladder-port and --ladder-dump: give one of them")
    if get("--ladder-regen") and get("--ladder-regen-all"):
        _usage("--ladder-regen and --ladder-regen-all: give one of them (-all rewrites every "
               "golden fixture, the other only failing)")
    if opt(config, "params") and opt(config, "cact"):
        _usage(f"--ladder-params {opt(config, 'params')} and --ladder-cact "
               f"{opt(config, 'cact')}: give one of them, not both")
    if plant and (dump or port or config.getini("ladder_port")):
        _usage(f"--ladder-plant {plant} plants a bug in our port (port.V2Model); the port "
               f"under test is {dump or port or config.getini('ladder_port')}")
    if not ours(config):
        for name, default in (("backend", "torch"), ("decode", "eager"), ("device", "cpu")):
            v = get(f"--ladder-{name}")
            if v != default:
                _usage(f"--ladder-{name} {shown(v)} configures our port (port.V2Model); the "
                       f"port under test is {dump or port or config.getini('ladder_port')}, "
                       f"which runs as it is built (drop --ladder-{name})")
    if hasattr(config, "workerinput"):      # an xdist worker: the controller checked all this
        return
    _precision(config)
    _backend(config)
    if plant:
        _plant(config, plant)
    _files(config)
    if opt(config, "port"):
        _port_spec(config, opt(config, "port"))
    if ours(config) and get("--ladder-backend") == "native":
        from kernels.native import unavailable_reason      # builds the C step (last: slow)
        why = unavailable_reason()
        if why:
            _usage(f"--ladder-backend native cannot run here: {why.splitlines()[0]}; use "
                   f"--ladder-backend torch")


def _precision(config) -> None:
    spec = config.getoption("--ladder-precision")
    if spec is None:
        return
    from ladder.model.precision import Precision, PrecisionError, weights_contradiction
    try:
        prec = Precision.parse(spec, f"--ladder-precision {shown(spec)}")
    except PrecisionError as e:
        _usage(str(e))
    if not ours(config):        # it declares what the port or recording computes in
        return
    why = weights_contradiction(spec, prec, weight_form(config), "--ladder-weights")
    if why:
        _usage(f"--ladder-precision {shown(spec)}: {why}")
    from port.backend import BACKEND_CLASSES, DECODES
    backend, decode = config.getoption("--ladder-backend"), config.getoption("--ladder-decode")
    if not BACKEND_CLASSES[backend].runs_precision(prec, decode):
        where = [f"--ladder-backend {b} --ladder-decode {d}"
                 for b, cls in BACKEND_CLASSES.items() for d in DECODES
                 if (not cls.native or cls.runs_on("cpu", d)) and cls.runs_precision(prec, d)]
        _usage(f"--ladder-precision {shown(spec)} ({prec.short()}): our port does not compute "
               f"at it on --ladder-backend {backend} --ladder-decode {decode}; it does on "
               f"{'; '.join(where)}")


def _backend(config) -> None:
    backend, decode = config.getoption("--ladder-backend"), config.getoption("--ladder-decode")
    device = config.getoption("--ladder-device")
    kind = "cpu"
    if device != "cpu":
        import torch
        try:
            dev = torch.device(device)
        except (RuntimeError, ValueError, TypeError) as e:
            _usage(f"--ladder-device {shown(device)}: not a device torch knows "
                   f"({str(e).splitlines()[0][:120]}); e.g. cpu, cuda, cuda:1")
        kind = dev.type
        if kind not in ("cpu", "cuda"):
            _usage(f"--ladder-device {shown(device)}: device type {kind!r} is not one the port "
                   f"runs on (cpu, cuda, cuda:N)")
        if kind == "cuda" and not torch.cuda.is_available():
            _usage(f"--ladder-device {shown(device)}: torch.cuda.is_available() is False here "
                   f"(torch {torch.__version__}); use --ladder-device cpu")
        if kind == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
            _usage(f"--ladder-device {shown(device)}: index {dev.index} outside 0.."
                   f"{torch.cuda.device_count() - 1}, the CUDA devices here")
    from port.backend import backend_class
    cls = backend_class(backend)
    if cls.native and not cls.runs_on(kind, decode):
        _usage(f"--ladder-backend native runs on the CPU, eagerly (given --ladder-device "
               f"{shown(device)} --ladder-decode {decode}); drop those flags, or use "
               f"--ladder-backend torch")
    if cls.needs_triton and importlib.util.find_spec("triton") is None:
        _usage("--ladder-backend triton: Triton is not installed (pip install "
               "'needle-parity[gpu]'); use --ladder-backend torch")


def _plant(config, plant: str) -> None:
    from ladder.sides.faults import FAULTS
    from ladder.sides.path_faults import PATH_FAULTS
    backend, decode = config.getoption("--ladder-backend"), config.getoption("--ladder-decode")
    path = PATH_FAULTS.get(plant)
    fault = FAULTS.get(plant)
    if path is None and fault is None:
        _usage(f"--ladder-plant {shown(plant)}: unknown; known: "
               f"{', '.join(sorted(FAULTS) + sorted(PATH_FAULTS))}")
    why = path.not_in(backend, decode) if path is not None else fault.not_in(backend) or (
        f"it lives in cq weights, and this run's are {weight_form(config)} (give "
        f"--ladder-weights cq)" if fault.weights == "cq" != weight_form(config) else
        fault.needs)
    if why:
        _usage(f"--ladder-plant {plant}: cannot be planted in --ladder-backend {backend} "
               f"--ladder-decode {decode}: {why}")


def _files(config) -> None:
    from ladder.cli.args import (SAFETENSORS_HINT, input_file, looks_like_cact,
                                 looks_like_safetensors, writable_dir)
    params, cact = opt(config, "params"), opt(config, "cact")
    if params:
        _cli_check(input_file, "--ladder-params", params, SAFETENSORS_HINT)
        if looks_like_cact(params):
            _usage(f"--ladder-params {shown(params)} is a .cact checkpoint; use --ladder-cact")
        from bounded.io import InputFileError
        from bounded.safetensors import read_safetensors_header
        try:
            read_safetensors_header(params)
        except InputFileError as e:
            _usage(f"--ladder-params {shown(params)}: not a readable safetensors file ({e})")
    if cact:
        _cli_check(input_file, "--ladder-cact", cact, "a .cact checkpoint")
        if looks_like_safetensors(cact):
            _usage(f"--ladder-cact {shown(cact)} is a safetensors file; use --ladder-params")
        if not looks_like_cact(cact):
            _usage(f"--ladder-cact {shown(cact)}: not a .cact file (its first 4 bytes are not "
                   f"the .cact tag); --ladder-cact takes a checkpoint written by cactus-needle "
                   f"or write_cact")
    rules = opt(config, "rules")
    if rules:
        flag = "--ladder-rules" if config.getoption("--ladder-rules") else "ladder_rules (ini)"
        _cli_check(input_file, flag, rules, "a .toml or .json rules file (see `python -m "
                                            "ladder rules`)")
        from ladder.engine.rules import RulesError, load_rules
        try:
            load_rules(rules)
        except RulesError as e:
            _usage(f"{flag}: {e}")
    dump = config.getoption("--ladder-dump")
    if dump and not (os.path.isfile(dump) or os.path.isfile(dump + ".json")):
        what = "is a directory" if os.path.isdir(dump) else "no such file"
        _usage(f"--ladder-dump {shown(dump)}: {what} (give a trace archive, or a needle-rs "
               f"stem: STEM.json beside its blobs)")
    if dump:
        # read once here: a damaged recording is one usage error, not a failure per test
        import argparse as _argparse

        from ladder.sides.side_spec import load_side
        try:
            load_side(dump, _argparse.Namespace(max_memory=None, map=None))
        except (ValueError, OSError) as e:   # the readers' errors are ValueErrors
            _usage(f"--ladder-dump {shown(dump)}: cannot be read: "
                   f"{str(e).splitlines()[0][:300]}")
    out = config.getoption("--ladder-out")
    if out:
        _cli_check(writable_dir, "--ladder-out", out)


def _port_spec(config, spec: str) -> None:
    """A typo in --ladder-port (module or factory) is a usage error before any test runs, not a
    traceback in every test. The module may sit beside the tests, which pytest puts on sys.path
    only as it collects them, so it is looked for there as well as on sys.path."""
    import sys
    from ladder.sides.ports import PortLoadError, load_factory
    root = os.path.abspath(str(config.rootpath))
    extra = [root, os.path.abspath(str(config.invocation_params.dir))]
    for a in config.args:
        d = os.path.abspath(a.split("::", 1)[0])
        d = d if os.path.isdir(d) else os.path.dirname(d)
        while d.startswith(root) and d not in extra:
            extra.append(d)
            d = os.path.dirname(d)
    saved = list(sys.path)
    sys.path[:0] = [d for d in extra if d not in sys.path]
    try:
        load_factory(spec)
    except PortLoadError as e:
        raise pytest.UsageError(str(e).replace("--port", "--ladder-port", 1)) from None
    finally:
        sys.path[:] = saved
