"""The grid of a `python -m ladder sweep`: a TOML file read into cases, each one `run`
(or JSON with the same tables: the project's TOML reader is tomllib, Python 3.11+).

    [sweep]                 name = "tiny"            (optional)
    [grid]                  every combination, in product order; each key a list
    [fixed]                 flags held for every case (optional)
    [[exclude]]             partial cases to drop: every key given must match (optional;
                            a value may be a list: any of them)

Keys are `run` flags with `_` for `-` (KEYS below). A case is its settings (grid values plus
fixed ones, in that order); its id `c0007-1a2b3c4d` is its index in product order (after the
excludes) and a hash of its settings, so a renamed grid file or a reordered [fixed] table
keeps the ids, and two machines expanding the same grid get the same list. Shard K/N takes
the cases whose index % N == K-1: disjoint, and together every case, with no coordination.

Everything here is checked before any case runs; a bad grid raises SweepError naming the
key, the value or the case (the CLI exits 2).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import math
import os
from dataclasses import dataclass

MAX_GRID_FILE = 1 << 20          # bytes of TOML: a grid is a few lines
MAX_CASES = 100_000              # a grid past this is a typo (or wants its own scheduler)
FORMAT = "needle-parity-sweep"
SCHEMA = 1

# key -> (run flag, accepted types, what a value is). `window` also takes "default" (the
# model's own window) and `plant` "none" (no fault), so a list can mix them with the others.
KEYS = {
    "preset": ("--preset", (str,), "a preset name (tiny, shipped)"),
    "params": ("--params", (str,), "a safetensors parameter file (relative to the grid)"),
    "cact": ("--cact", (str,), "a .cact checkpoint (relative to the grid)"),
    "seed": ("--seed", (int,), "an integer seed"),
    "prompt_len": ("--prompt-len", (int,), "an integer >= 1"),
    "steps": ("--steps", (int,), "an integer >= 0"),
    "window": ("--window", (int, str), "an integer window or \"default\""),
    "weights": ("--weights", (str,), "dense or cq"),
    "bits_map": ("--bits-map", (str,), "a CQ widths map, e.g. embedding=4,mhc=4,default=2"),
    "backend": ("--backend", (str,), "torch, triton or native"),
    "decode": ("--decode", (str,), "eager or graph"),
    "device": ("--device", (str,), "a device, e.g. cpu or cuda"),
    "rules": ("--rules", (str,), "a rules file (relative to the grid)"),
    "no_check_plain": ("--no-check-plain", (bool,), "true or false"),
    "plant": ("--plant", (str,), "a fault name (run --list-faults) or \"none\""),
    "port_precision": ("--port-precision", (str,), "a precision, e.g. bfloat16 or "
                                                   "float32,kv=int8 (docs/precision.md)"),
    "port": ("--port", (str,), "a protocol port's module:factory (ladder/sides/ports.py) or "
                               "\"ours\" (port.V2Model)"),
}
PATH_KEYS = ("params", "cact", "rules")
TABLES = ("sweep", "grid", "fixed", "exclude")


class SweepError(ValueError):
    """A grid, shard spec or sweep directory the sweep refuses (names the key/value/case)."""


@dataclass(frozen=True)
class Case:
    index: int
    id: str
    settings: dict

    def describe(self) -> str:
        return " ".join(f"{k}={json.dumps(v)}" for k, v in self.settings.items())


@dataclass
class Grid:
    path: str
    name: str
    body: dict                  # the normalized tables: what the hash and sweep.json hold
    cases: list
    files: dict                 # a file the grid names -> sha256 of its bytes
    sha256: str

    @property
    def base(self) -> str:
        return os.path.dirname(os.path.abspath(self.path))


def _kind_ok(key: str, v) -> bool:
    kinds = KEYS[key][1]
    if isinstance(v, bool):                 # a TOML true is no seed
        return bool in kinds
    if isinstance(v, str) and str in kinds and key == "window":
        return v == "default"
    return isinstance(v, kinds)


def _value(where: str, key: str, v):
    if key not in KEYS:
        raise SweepError(f"{where}: unknown key {key!r}; the keys are run flags: "
                         f"{', '.join(KEYS)}")
    if not _kind_ok(key, v):
        raise SweepError(f"{where}.{key} = {json.dumps(v, default=str)}: must be "
                         f"{KEYS[key][2]}")
    if isinstance(v, str) and (not v.strip() or len(v) > 4096):
        raise SweepError(f"{where}.{key} = {v[:60]!r}: must be a non-empty string of at most "
                         f"4096 characters")
    return v


def _table(data: dict, name: str, where: str) -> dict:
    t = data.get(name, {})
    if not isinstance(t, dict):
        raise SweepError(f"{where}: [{name}] must be a table")
    return t


def _normalize(data: dict, where: str) -> dict:
    for k in data:
        if k not in TABLES:
            raise SweepError(f"{where}: unknown table or key {k!r}; a grid has "
                             f"[sweep], [grid], [fixed] and [[exclude]]")
    head = _table(data, "sweep", where)
    for k, v in head.items():
        if k not in ("name", "description") or not isinstance(v, str):
            raise SweepError(f"{where}: [sweep].{k} = {json.dumps(v, default=str)}: [sweep] "
                             f"takes name and description, both strings")
    grid = _table(data, "grid", where)
    if not grid:
        raise SweepError(f"{where}: [grid] is empty or missing; give at least one key with a "
                         f"list of values, e.g. seed = [0, 1]")
    for k, vals in grid.items():
        if not isinstance(vals, list):
            raise SweepError(f"{where}: grid.{k} = {json.dumps(vals, default=str)}: must be a "
                             f"list (a value held for every case goes under [fixed])")
        if not vals:
            raise SweepError(f"{where}: grid.{k} = []: an empty list makes no cases; give at "
                             f"least one value or drop the key")
        seen = []
        for v in vals:
            _value(f"{where}: grid", k, v)
            if any(type(v) is type(s) and v == s for s in seen):
                raise SweepError(f"{where}: grid.{k} lists {json.dumps(v)} twice")
            seen.append(v)
    fixed = _table(data, "fixed", where)
    for k, v in fixed.items():
        _value(f"{where}: fixed", k, v)
        if k in grid:
            raise SweepError(f"{where}: {k!r} is in both [grid] and [fixed]; keep one")
    exclude = data.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(e, dict) for e in exclude):
        raise SweepError(f"{where}: exclude must be an array of tables ([[exclude]])")
    for i, e in enumerate(exclude, 1):
        if not e:
            raise SweepError(f"{where}: exclude #{i} is empty: it would drop every case")
        for k, v in e.items():
            for x in (v if isinstance(v, list) else [v]):
                _value(f"{where}: exclude #{i}", k, x)
            if k not in grid and k not in fixed:
                raise SweepError(f"{where}: exclude #{i} names {k!r}, which is in neither "
                                 f"[grid] nor [fixed]")
    return {"sweep": dict(head), "grid": dict(grid), "fixed": dict(fixed),
            "exclude": [dict(e) for e in exclude]}


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


def _excluded(settings: dict, exclude: list, hits: list) -> bool:
    for i, e in enumerate(exclude):
        if all(any(_same(settings[k], x) for x in (v if isinstance(v, list) else [v]))
               for k, v in e.items()):
            hits[i] += 1
            return True
    return False


def case_id(index: int, settings: dict, width: int) -> str:
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
    return f"c{index:0{width}d}-{h}"


def expand(body: dict, where: str = "grid") -> list:
    """The cases of a normalized grid, in product order (the first key varies slowest)."""
    grid, fixed, exclude = body["grid"], body["fixed"], body["exclude"]
    total = math.prod(len(v) for v in grid.values())
    if total > MAX_CASES:
        raise SweepError(f"{where}: {' x '.join(str(len(v)) for v in grid.values())} = "
                         f"{total} combinations, over the limit of {MAX_CASES}; split the grid")
    keys, hits, kept = list(grid), [0] * len(exclude), []
    for combo in itertools.product(*grid.values()):
        settings = dict(zip(keys, combo), **fixed)
        if not _excluded(settings, exclude, hits):
            kept.append(settings)
    for i, n in enumerate(hits, 1):
        if n == 0:
            raise SweepError(f"{where}: exclude #{i} {json.dumps(exclude[i - 1])} matches no "
                             f"case (a misspelt value?)")
    if not kept:
        raise SweepError(f"{where}: every case is excluded")
    width = max(4, len(str(len(kept) - 1)))
    return [Case(i, case_id(i, s, width), s) for i, s in enumerate(kept)]


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def body_sha256(body: dict, files: dict) -> str:
    """The grid's identity: its tables and the bytes of every file it names, so two shards
    run against different rules files (same name) do not merge."""
    text = json.dumps({"body": body, "files": files}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def resolve(base: str, key: str, value):
    """A path setting as `run` gets it: relative to the grid file's directory."""
    if key in PATH_KEYS:
        return os.path.normpath(os.path.join(base, os.path.expanduser(value)))
    return value


def load_grid(path: str) -> Grid:
    """The grid file read (bounded), checked and expanded. Flag values are not judged here
    (that is `sweep.validate_cases`, with the CLI's own checks)."""
    from bounded.io import parse_json, parse_toml, read_capped
    if not path or not path.strip():
        raise SweepError("sweep: give the grid file (GRID.toml), or --merge DIR...")
    if not path.endswith((".toml", ".json")):
        raise SweepError(f"sweep {path}: the grid must be a .toml file (or .json with the same "
                         f"tables, where Python < 3.11 has no tomllib)")
    raw = read_capped(path, MAX_GRID_FILE, SweepError, "grid file")
    data = (parse_toml if path.endswith(".toml") else parse_json)(raw, path, SweepError)
    if not isinstance(data, dict):
        raise SweepError(f"{path}: the grid must be a table (a JSON object)")
    body = _normalize(data, path)
    cases = expand(body, path)
    base = os.path.dirname(os.path.abspath(path))
    files = {}
    for c in cases:
        for k in PATH_KEYS:
            if k in c.settings and c.settings[k] not in files:
                p = resolve(base, k, c.settings[k])
                if not os.path.isfile(p):
                    raise SweepError(f"{path}: {k} = {c.settings[k]!r}: no such file {p} "
                                     f"(paths are relative to the grid file)")
                files[c.settings[k]] = _file_sha256(p)
    name = body["sweep"].get("name") or os.path.splitext(os.path.basename(path))[0]
    return Grid(path, name, body, cases, files, body_sha256(body, files))


def parse_shard(spec: str) -> tuple:
    """'K/N' -> (K, N), 1 <= K <= N."""
    parts = str(spec).split("/")
    try:
        if len(parts) != 2:
            raise ValueError
        k, n = int(parts[0]), int(parts[1])
    except ValueError:
        raise SweepError(f"--shard {spec!r}: must be K/N, two integers, e.g. --shard 2/4 (the "
                         f"2nd of 4 shards)") from None
    if n < 1 or not 1 <= k <= n:
        raise SweepError(f"--shard {spec}: K/N needs N >= 1 and 1 <= K <= N (shards are "
                         f"numbered from 1; in a Slurm array: $((SLURM_ARRAY_TASK_ID+1)))")
    if n > MAX_CASES:
        raise SweepError(f"--shard {spec}: N over {MAX_CASES} shards")
    return k, n


def shard_cases(cases: list, k: int, n: int) -> list:
    """Shard k of n: every n-th case from the (k-1)-th, so shards interleave the grid's axes
    and take equal shares of slow and fast settings."""
    return [c for c in cases if c.index % n == k - 1]


def run_argv(case: Case, base: str) -> list:
    """The `run` flags of a case (paths resolved against the grid's directory)."""
    argv = []
    for k, v in case.settings.items():
        flag = KEYS[k][0]
        if isinstance(v, bool):
            argv += [flag] if v else []
        elif (k, v) in (("window", "default"), ("plant", "none"), ("port", "ours")):
            continue
        else:
            argv += [flag, str(resolve(base, k, v))]
    return argv


_PARSER = []                     # the run parser, built once per process (argparse is slow)


def run_args(case: Case, base: str | None):
    """argparse's Namespace for the case's `run` (a parse error raises, never exits)."""
    from ladder.cli.parser import build_parser
    if not _PARSER:
        _PARSER.append(build_parser())
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return _PARSER[0].parse_args(["run", *run_argv(case, base)])
    except SystemExit:
        raise SweepError(err.getvalue().strip().splitlines()[-1]) from None
