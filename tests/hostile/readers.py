"""Hostile inputs for the readers added since the first fuzzing round (issue 32): trace archives
and their JSON manifests, needle-rs fixtures, TOML name maps, sweep grids, a sweep's
result.json and sweep.json (--merge), --port factories, and the image needle_trace.c reads.

Shared by tests/hostile/test_fuzz_readers.py (Hypothesis drives `rng`, few examples) and
tools/hostile/hostile_inputs.py --readers (a seeded random.Random, a thousand and more cases). Each
`mutate(rng, base, tmp)` returns a Case: the files it wrote, how to read them (`read`: the
reader itself, in process) and the CLI command that reads them (`argv`), and whether the input
is certainly invalid (`hostile`: it must be refused, never accepted).
"""
from __future__ import annotations

from tests import paths
import json
import os
import shutil
import struct
from dataclasses import dataclass, field
from typing import Callable

ROOT = paths.ROOT
BUDGET = 64 << 20                    # --max-memory for every case: a lie past it is refused

# Values that break naive readers: huge, negative, wrong type, non-finite, deep, long.
HOSTILE = [0, -1, 1, 2 ** 31, 2 ** 63, 10 ** 30, 1e308, -1e308, 0.5, "8", "", None, True,
           False, [], {}, [1, 2], {"a": 1}, "\uff45", "x" * 10000, [0] * 5000]
CONFUSABLE = {"a": "\u0430", "e": "\uff45", "o": "\u03bf", "i": "\u0456", "s": "\u0455"}


@dataclass
class Case:
    kind: str                        # what was done to the input
    read: Callable                   # () -> anything; raises the reader's error on refusal
    argv: list                       # the CLI command that reads the same files
    hostile: bool = False            # certainly invalid: must be refused
    errors: tuple = field(default=())


# ---------------------------------------------------------------- JSON and TOML text
def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:8]):
            yield from _paths(v, prefix + (i,))


def _set(obj, path, value):
    for p in path[:-1]:
        obj = obj[p]
    obj[path[-1]] = value


def mutate_json(rng, obj) -> tuple:
    """(text, kind, hostile) of `obj` after one hostile edit."""
    obj = json.loads(json.dumps(obj))
    paths = [p for p in _paths(obj) if p]
    r = rng.randrange(9)
    if r == 0 or not paths:
        depth = rng.choice([70, 200, 5000])                        # nesting past the bound
        return "[" * depth + "]" * depth, f"nesting {depth}", True
    path = rng.choice(paths)
    if r in (1, 2, 3):                                             # a hostile value
        v = rng.choice(HOSTILE)
        _set(obj, path, v)
        return json.dumps(obj), f"{'.'.join(map(str, path))} = {str(v)[:20]!r}", False
    if r == 4:                                                     # a non-finite number
        _set(obj, path, "__NONFINITE__")
        lit = rng.choice(["NaN", "Infinity", "-Infinity"])
        return json.dumps(obj).replace('"__NONFINITE__"', lit), f"{path} = {lit}", True
    parent = obj
    for p in path[:-1]:
        parent = parent[p]
    key = path[-1]
    if r == 5 and isinstance(parent, dict):                        # a key dropped
        del parent[key]
        return json.dumps(obj), f"drop {'.'.join(map(str, path))}", False
    if r == 6 and isinstance(parent, dict) and isinstance(key, str) and key:
        text = json.dumps(obj)                                     # a duplicate key
        frag = json.dumps(key) + ": "
        i = text.find(frag)
        if i >= 0:
            dup = frag + json.dumps(rng.choice(HOSTILE[:10])) + ", "
            return text[:i] + dup + text[i:], f"duplicate key {key!r}", True
    if r == 7 and isinstance(parent, dict) and isinstance(key, str):
        look = "".join(CONFUSABLE.get(c, c) for c in key)           # a look-alike key
        if look != key:
            parent[look] = parent.pop(key)
            return json.dumps(obj), f"look-alike key {look!r}", False
    text = json.dumps(obj)                                         # truncated text
    cut = rng.randrange(1, max(2, len(text) - 1))
    return text[:cut], f"JSON cut at {cut} of {len(text)}", True


def mutate_toml(rng, text: str) -> tuple:
    lines = text.splitlines()
    r = rng.randrange(7)
    i = rng.randrange(len(lines))
    if r == 0:                                                     # a line dropped
        return "\n".join(lines[:i] + lines[i + 1:]), f"drop line {i + 1}", False
    if r == 1 and "=" in lines[i] and not lines[i].lstrip().startswith("#"):
        k, _, _ = lines[i].partition("=")                          # a hostile value
        v = rng.choice(['-1', '1e999', 'nan', '"\uff45"', '[[[[[[[[[1]]]]]]]]]', '{a = 1}',
                        '"' + "x" * 5000 + '"', "[" + ", ".join(["0"] * 5000) + "]", "true"])
        lines[i] = f"{k}= {v}"
        return "\n".join(lines), f"line {i + 1} value {v[:20]!r}", False
    if r == 2 and "=" in lines[i] and not lines[i].lstrip().startswith("#"):
        lines.insert(i + 1, lines[i])                              # a duplicate key
        return "\n".join(lines), f"duplicate line {i + 1}", True
    if r == 3:                                                     # nesting past the bound
        depth = rng.choice([70, 3000])
        return text + f"\nx = {'[' * depth}{']' * depth}\n", f"nesting {depth}", True
    if r == 4:                                                     # a look-alike key
        lines[i] = "".join(CONFUSABLE.get(c, c) for c in lines[i].split("=")[0]) + \
            ("=" + lines[i].split("=", 1)[1] if "=" in lines[i] else "")
        return "\n".join(lines), f"look-alike line {i + 1}", False
    if r == 5:                                                     # dotted keys, deep
        return text + "\n" + ".".join(["k"] * rng.choice([40, 500])) + " = 1\n", \
            "dotted key", True
    cut = rng.randrange(1, len(text))
    return text[:cut], f"TOML cut at {cut}", False


def flip_bytes(rng, data: bytes, lo: int, hi: int) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randrange(1, 6)):
        b[rng.randrange(lo, min(hi, len(b)))] = rng.randrange(256)
    return bytes(b)


# ---------------------------------------------------------------- safetensors framing
def st_parts(data: bytes) -> tuple:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def st_join(header_text: str, body: bytes, lie: int = 0) -> bytes:
    h = header_text.encode()
    return struct.pack("<Q", len(h) + lie) + h + body


def mutate_safetensors(rng, data: bytes, meta_key: str | None) -> tuple:
    """(bytes, kind, hostile): the framing or the manifest inside the metadata lied about."""
    header, body = st_parts(data)
    r = rng.randrange(6)
    if r == 0 and meta_key and meta_key in header.get("__metadata__", {}):
        text, kind, hostile = mutate_json(rng, json.loads(header["__metadata__"][meta_key]))
        header["__metadata__"][meta_key] = text
        return st_join(json.dumps(header), body), "manifest " + kind, hostile
    names = [k for k in header if k != "__metadata__"]
    if r == 1 and names:                                           # a tensor entry lies
        name = rng.choice(names)
        fld = rng.choice(["shape", "data_offsets", "dtype"])
        header[name][fld] = rng.choice([[2 ** 40], [0, 2 ** 62], "F128", [-1, 4], [3, 2],
                                        [1] * 9, None, "I8"])
        return st_join(json.dumps(header), body), f"{name}.{fld} lies", True
    if r == 2:                                                     # header length lies
        lie = rng.choice([1, -1, 2 ** 20, len(body) + 1])
        return st_join(json.dumps(header), body, lie), f"header length {lie:+d}", True
    if r == 3:
        cut = rng.randrange(len(data))                             # truncated
        return data[:cut], f"truncated at {cut} of {len(data)}", cut < len(data)
    if r == 4:                                                     # bytes flipped anywhere
        return flip_bytes(rng, data, 0, len(data)), "bytes flipped", False
    return data + bytes(rng.randrange(1, 64)), "trailing bytes", True


# ---------------------------------------------------------------- the bases
def make_bases(d: str) -> dict:
    """One valid input of each kind, written under `d` (about 30 s on the 2-core machine)."""
    import contextlib
    import io
    from ladder.cli.main import main
    os.makedirs(d, exist_ok=True)
    quiet = contextlib.redirect_stderr(io.StringIO())
    small = ["--prompt-len", "2", "--steps", "2"]
    with quiet:
        assert main(["dump", "torch", "--out", f"{d}/torch.safetensors", *small],
                    out=lambda *a: None) == 0
        assert main(["regen", "--format", "needle-rs", "--out", f"{d}/nrs", *small],
                    out=lambda *a: None) == 0
        grid = ("[sweep]\nname = \"h\"\n[grid]\nseed = [0, 1]\n[fixed]\npreset = \"tiny\"\n"
                "steps = 1\nprompt_len = 1\nno_check_plain = true\n")
        with open(f"{d}/grid.toml", "w") as f:
            f.write(grid)
        assert main(["sweep", f"{d}/grid.toml", "--out", f"{d}/sweep"],
                    out=lambda *a: None) == 0
    shutil.copy(os.path.join(ROOT, "ladder", "formats", "maps", "needle-rs.toml"),
                f"{d}/map.toml")
    image = f"{d}/image.safetensors"
    exe = _image(image)
    return {"dir": d, "archive": f"{d}/torch.safetensors", "needle_rs": f"{d}/nrs",
            "map": f"{d}/map.toml", "grid": f"{d}/grid.toml", "sweep": f"{d}/sweep",
            "image": image, "exe": exe}


def _image(path: str) -> str:
    import argparse
    from ladder.cli.compare import native_exe_image
    from ladder.sides.fixtures import seeded_tokens
    from reference import V2Config, init_params
    cfg = V2Config.preset("tiny")
    params = init_params(cfg, 0, perturbed=True)
    args = argparse.Namespace(weights=None, cact=None, plant=None, params=None)
    return native_exe_image(args, params, cfg, seeded_tokens(cfg, 4, 0), 2, cfg.kv_window, path)


# ---------------------------------------------------------------- one case per reader
def archive_case(rng, base, tmp) -> Case:
    from ladder.engine.archive import META_KEY, ArchiveError
    from ladder.engine.trace import Ladder
    data, kind, hostile = mutate_safetensors(rng, open(base["archive"], "rb").read(), META_KEY)
    p = os.path.join(tmp, "a.safetensors")
    with open(p, "wb") as f:
        f.write(data)
    lazy = rng.random() < 0.5

    def read():
        lad = Ladder.load(p, BUDGET, lazy=lazy)
        return sum(float(v.double().abs().sum()) for v in
                   (lad.values[k] for k in lad.keys()))          # every value read
    return Case(kind, read, ["compare", p, "--max-memory", str(BUDGET)], hostile, (ArchiveError,))


def needle_rs_case(rng, base, tmp) -> Case:
    from ladder.formats.namemap import NameMapError
    from ladder.formats.needle_rs import NeedleRsError, read
    from ladder.model.geometry import GeometryError
    stem = os.path.join(tmp, "n")
    js, blob = open(base["needle_rs"] + ".json").read(), open(base["needle_rs"] + ".f32",
                                                                "rb").read()
    if rng.random() < 0.7:
        js, kind, hostile = mutate_json(rng, json.loads(js))
    else:
        cut = rng.randrange(len(blob) + 64)
        blob, kind, hostile = (blob[:cut] if cut < len(blob) else blob + bytes(cut - len(blob)),
                               f".f32 resized to {cut} of {len(blob)}", cut != len(blob))
    with open(stem + ".json", "w") as f:
        f.write(js)
    with open(stem + ".f32", "wb") as f:
        f.write(blob)
    return Case(kind, lambda: read(stem, BUDGET), ["compare", stem, "--max-memory", str(BUDGET)],
                hostile, (NeedleRsError, NameMapError, GeometryError))


def namemap_case(rng, base, tmp) -> Case:
    from ladder.formats.namemap import NameMapError, load_map
    from ladder.formats.needle_rs import read
    text, kind, hostile = mutate_toml(rng, open(base["map"]).read())
    p = os.path.join(tmp, "m.toml")
    with open(p, "w", encoding="utf-8") as f:
        f.write(text)
    return Case(kind, lambda: read(base["needle_rs"], BUDGET, load_map(p)),
                ["compare", base["needle_rs"], "--map", p], hostile, (NameMapError,))


def grid_case(rng, base, tmp) -> Case:
    from ladder.sweep.grid import SweepError, load_grid
    text, kind, hostile = mutate_toml(rng, open(base["grid"]).read())
    p = os.path.join(tmp, "g.toml")
    with open(p, "w", encoding="utf-8") as f:
        f.write(text)
    return Case(kind, lambda: load_grid(p), ["sweep", p, "--out", os.path.join(tmp, "o"),
                                             "--dry-run"], hostile, (SweepError,))


def merge_case(rng, base, tmp) -> Case:
    """A finished sweep's result.json or sweep.json edited, then merged (--merge)."""
    import argparse
    from ladder.sweep.grid import SweepError
    from ladder.sweep.report import cmd_merge
    d = os.path.join(tmp, "s")
    shutil.copytree(base["sweep"], d, symlinks=True)
    rows = sorted(os.path.join(r, "result.json") for r, _, fs in os.walk(d) if "result.json" in fs)
    target = rng.choice(rows + [os.path.join(d, "sweep.json")])
    text, kind, hostile = mutate_json(rng, json.load(open(target)))
    with open(target, "w") as f:
        f.write(text)
    kind = f"{os.path.relpath(target, d)}: {kind}"
    out = os.path.join(tmp, "m")
    merge = argparse.Namespace(merge=[d], out=out, allow_partial=False)
    return Case(kind, lambda: cmd_merge(merge, lambda *a: None),
                ["sweep", "--merge", d, "--out", out], hostile, (SweepError,))


PORT_BEHAVIOURS = {
    "factory raises": ("def build(params, cfg):\n    raise ZeroDivisionError('boom')\n", True),
    "factory returns an int": ("def build(params, cfg):\n    return 7\n", True),
    "factory returns None": ("def build(params, cfg):\n    return None\n", True),
    "factory sleeps": ("import time\ndef build(params, cfg):\n    time.sleep(30)\n", True),
    "make_state raises": ("class P:\n    def make_state(self):\n        raise KeyError('s')\n"
                          "    def step_traced(self, *a):\n        pass\n"
                          "def build(params, cfg):\n    return P()\n", True),
    "step_traced sleeps": ("import time\nclass P:\n    def make_state(self):\n        return 0\n"
                           "    def step_traced(self, *a):\n        time.sleep(30)\n"
                           "def build(params, cfg):\n    return P()\n", True),
    "step_traced records nothing": ("class P:\n    def make_state(self):\n        return 0\n"
                                    "    def step_traced(self, *a):\n        return None\n"
                                    "def build(params, cfg):\n    return P()\n", True),
}


def port_case(rng, base, tmp) -> Case:
    """A --port factory that misbehaves, or a toy port whose values are spoiled (wrong shape,
    wrong dtype, NaN, a dropped or repeated point), or a --port string that names nothing."""
    from ladder.sides.ports import PortLoadError
    from ladder.model.names import TraceError
    r = rng.randrange(3)
    mod = f"hostile_port_{rng.randrange(10 ** 9)}"          # its own name: imports are cached
    if r == 0:
        kind = rng.choice(sorted(PORT_BEHAVIOURS))
        src, hostile = PORT_BEHAVIOURS[kind]
    elif r == 1:
        spoil = rng.choice(sorted(SPOILS))
        kind, hostile = f"toy port: {spoil}", True
        src = _spoiled_toy(spoil)
    else:
        spec = rng.choice(["", ":", "x:", ":y", "os:path", "os:getcwd", "json:loads:x",
                           "no_such_mod_zz:build", "tests.ports.toy_port:nope",
                           "tests.ports.toy_port:build.x", "\uff54oy:build", "a" * 300 + ":b"])
        argv = ["run", "--port", spec, "--steps", "1", "--prompt-len", "1", "--no-check-plain",
                "--port-timeout", "5"]
        return Case(f"--port {spec[:30]!r}", lambda: _load(spec), argv,
                    spec not in ("os:getcwd",), (PortLoadError,))
    with open(os.path.join(tmp, mod + ".py"), "w") as f:
        f.write(src)
    spec = f"{mod}:build"
    argv = ["run", "--port", spec, "--steps", "1", "--prompt-len", "1", "--no-check-plain",
            "--port-timeout", "2"]
    return Case(kind, lambda: _capture(spec, tmp), argv, hostile,
                (PortLoadError, TraceError, Diverged))


def _load(spec):
    from ladder.sides.ports import load_factory
    return load_factory(spec)


def _capture(spec, tmp):
    import sys
    from ladder.engine.compare import compare_ladders
    from ladder.engine.rules import DEFAULT_RULES
    from ladder.sides.capture import capture_reference
    from ladder.sides.fixtures import seeded_tokens
    from ladder.sides.ports import build_port, capture_protocol
    from reference import V2Config, init_params
    sys.path.insert(0, tmp)
    try:
        cfg = V2Config.preset("tiny")
        params = init_params(cfg, 0, perturbed=True)
        toks = seeded_tokens(cfg, 2, 0)
        port = build_port(spec, params, cfg, timeout=2)
        lad = capture_protocol(port, cfg, toks, 1, timeout=2)
        cmp = compare_ladders(lad, capture_reference(params, cfg, toks, 1), DEFAULT_RULES)
        if not cmp.passed:
            raise Diverged(str(cmp).splitlines()[0])
        return cmp
    finally:
        sys.path.remove(tmp)


class Diverged(Exception):
    """A spoiled port captured and compared, and failing: a verdict, not a crash."""


SPOILS = {
    "shape": "v = v.reshape(-1)[:-1] if name == 'u' else v",
    "dtype": "v = v.half() if name == 'bx' else v",
    "nan": "v = v * float('nan') if name == 'attn_out' else v",
    "int": "v = v.to(torch.int32) if name == 'x' else v",
    "drop": "if name == 'hpre':\n                return None",
    "repeat": "if name == 'u':\n                trace(name, layer, v)",
}


def _spoiled_toy(spoil: str) -> str:
    """tests/ports/toy_port.py with one point's values spoiled on their way to the recorder."""
    return f"""import torch
from tests.ports import toy_port


def build(params, cfg):
    port = toy_port.build(params, cfg)
    inner = port.step_traced

    def step_traced(token, state, logits, trace):
        def spoiled(name, layer, v):
            {SPOILS[spoil]}
            return trace(name, layer, v)
        return inner(token, state, logits, spoiled)
    port.step_traced = step_traced
    return port
"""


def image_case(rng, base, tmp) -> Case:
    """needle_trace.c's image (a safetensors file), corrupted, run by the program itself."""
    import subprocess
    data, kind, hostile = mutate_safetensors(rng, open(base["image"], "rb").read(), None)
    p, out = os.path.join(tmp, "image.safetensors"), os.path.join(tmp, "trace.safetensors")
    with open(p, "wb") as f:
        f.write(data)

    def read():
        res = subprocess.run([base["exe"], p, out], capture_output=True, text=True, timeout=60)
        if res.returncode < 0:
            raise AssertionError(f"needle_trace died of signal {-res.returncode}")
        if res.returncode:
            lines = res.stderr.strip().splitlines()
            if len(lines) != 1 or not lines[0].startswith("needle_trace: "):
                raise AssertionError(f"needle_trace exit {res.returncode}: {res.stderr[-300:]}")
            raise ImageRefused(lines[0])
        return res.stdout
    return Case(kind, read, [], hostile, (ImageRefused,))


class ImageRefused(Exception):
    """needle_trace refused its image: a nonzero exit with one line on stderr."""


READERS = {"archive": archive_case, "needle_rs": needle_rs_case, "namemap": namemap_case,
           "grid": grid_case, "merge": merge_case, "port": port_case, "image": image_case}
