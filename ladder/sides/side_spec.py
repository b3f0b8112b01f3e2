"""A side named on the command line (`compare A B`, `run --dump`, `ladder_check`): a file read
as a Ladder (trace archive, needle-rs fixture, our fixture, a foreign file through a name map),
or one of the live sides (LIVE); and the checks that recorded sides agree with each other and
with the model (weights identity, geometry, schedule, registry, recorded argmax).
"""
from __future__ import annotations

import hashlib
import os

from ladder.engine.trace import Ladder
from ladder.sides.model_input import LadderInputError

LIVE = ("reference", "torch", "native", "triton", "port", "native-exe")


def _err(msg):
    return LadderInputError(msg)


def _brief(v) -> str:
    """repr(v) cut to 60 characters: a file's value may be a list of thousands."""
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_side(spec: str, args) -> Ladder:
    """A file side as a Ladder whose `.meta` says what it knows (geometry, window, weights)."""
    from ladder.sides import fixtures
    from ladder.formats import needle_rs
    from ladder.engine.archive import META_KEY
    if not spec:
        raise _err("compare: an empty side; give a file, reference, torch, native, triton or "
                   "port")
    budget = args.max_memory
    if needle_rs.is_needle_rs(spec):
        return needle_rs.read(spec, budget, _map(args) if args.map else None)
    if os.path.isfile(spec):
        from reference.params import read_safetensors_header
        header, _ = read_safetensors_header(spec, budget)
        if META_KEY in header.get("__metadata__", {}):
            return Ladder.load(spec, budget, lazy=True)     # streamed, step by step
        if args.map:
            from ladder.formats.foreign import read_mapped
            return read_mapped(spec, _map(args), budget)
    stem = fixtures.find_stem(spec)
    if stem is None:
        raise _err(f"compare: side {spec!r} is not a trace archive, a needle-rs fixture "
                   f"(STEM.json + STEM.f32), our fixture (STEM.json + STEM.safetensors) or, "
                   f"with --map, a safetensors file of another implementation's names; nor "
                   f"one of {', '.join(LIVE)}")
    fx = fixtures.load(stem, budget)
    lad = fx.ladder
    lad.meta = {"format": "needle-parity fixture", "geometry": geometry_dict(fx.cfg),
                "kv_window": fx.window, "weights": {"params_sha256":
                                                    fx.manifest["params"].get("sha256")},
                "producer": {"name": fx.manifest.get("generator", "fixture")}}
    return lad


def _map(args):
    from ladder.formats.namemap import load_map
    return load_map(args.map)


def geometry_dict(cfg) -> dict:
    from ladder.model.geometry import geometry_of
    return geometry_of(cfg)


def schedule_of(lad: Ladder) -> tuple:
    first = lad.steps[0]
    prompt = len(first.tokens) if first.name == "prefill" else 1
    return lad.tokens, prompt


def weights_identity(name: str, w: dict, src) -> str:
    """Check a recorded side's `weights` block against the model (src) and say, in one line,
    which identity fields were checked and which were absent. Errors: `params_sha256` that is
    not the digest of the weights the reference runs on; `sha256` that is not the hash of the
    weights file the model was loaded from. `file` is a name, never an identity: it is shown."""
    checked, unchecked = [], []
    for key, mine_key, what in (("params_sha256", "sha256", "the weights the reference runs on"),
                                ("sha256", "file_sha256", "the model's weights file")):
        theirs = w.get(key)
        mine = src.get(mine_key) if src is not None else None
        if theirs is None:
            unchecked.append(f"{key} absent")
        elif not isinstance(theirs, str):
            raise _err(f"compare: {name}: weights field {key} is {type(theirs).__name__}, not "
                       f"a hex string")
        elif mine is None:
            unchecked.append(f"{key} not checked (" + (
                "no model loaded" if src is None else "the model was not loaded from a file")
                + ")")
        elif theirs.lower() != mine:
            raise _err(f"compare: {name}: weights field {key} is {theirs}, but {what} hash to "
                       f"{mine} ({_model_name(src)})")
        else:
            checked.append(key)
    if w.get("file") is not None:
        unchecked.append(f"file {str(w['file'])[:80]!r} (a name, not checked)")
    return (f"weights identity of {name}: checked " + (", ".join(checked) or "nothing")
            + ("; " + "; ".join(unchecked) if unchecked else ""))


def check_agree(sides: list, cfg, src) -> list:
    """Geometry, weights and schedule of every file side against the model and each other;
    exit 2 naming the field and both values. Returns a line per file side saying which weight
    identity fields were checked and which were absent."""
    from ladder.model.geometry import geometry_mismatch
    files = [(name, lad) for name, lad in sides if lad is not None]
    model_geo = geometry_dict(cfg) if cfg is not None else None
    notes = []
    for name, lad in files:
        geo = lad.meta.get("geometry")
        if model_geo is not None and geo:
            bad = geometry_mismatch(geo, model_geo)
            if bad:
                raise _err(f"compare: geometry field {bad[0]} is {_brief(bad[1])} in {name}, "
                           f"{_brief(bad[2])} in the model ({_model_name(src)})")
        notes.append(weights_identity(name, lad.meta.get("weights") or {}, src))
    for (na, a), (nb, b) in zip(files, files[1:]):
        pa = (a.meta.get("weights") or {}).get("params_sha256")
        pb = (b.meta.get("weights") or {}).get("params_sha256")
        if isinstance(pa, str) and isinstance(pb, str) and pa.lower() != pb.lower():
            raise _err(f"compare: weights field params_sha256 is {pa} in {na}, {pb} in {nb}: "
                       f"recorded on different weights")
        ga, gb = a.meta.get("geometry") or {}, b.meta.get("geometry") or {}
        bad = geometry_mismatch(ga, gb)
        if bad:
            raise _err(f"compare: geometry field {bad[0]} is {_brief(bad[1])} in {na}, "
                       f"{_brief(bad[2])} in {nb}")
        if a.tokens != b.tokens:
            i = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y),
                     min(len(a.tokens), len(b.tokens)))
            va = a.tokens[i] if i < len(a.tokens) else "(none)"
            vb = b.tokens[i] if i < len(b.tokens) else "(none)"
            raise _err(f"compare: tokens differ at position {i}: {va} in {na}, {vb} in {nb}")
        sa = [(s.pos, len(s.tokens)) for s in a.steps]
        sb = [(s.pos, len(s.tokens)) for s in b.steps]
        if sa != sb:
            raise _err(f"compare: schedules differ: steps (pos, len) {sa[:4]}... in {na}, "
                       f"{sb[:4]}... in {nb}")
        wa = a.meta.get("kv_window")
        wb = b.meta.get("kv_window")
        if wa is not None and wb is not None and wa != wb:
            raise _err(f"compare: field kv_window is {wa} in {na}, {wb} in {nb}")
    return notes


def _model_name(src) -> str:
    return f"{src['source']} {src.get('preset', src.get('file', ''))}".strip()


def side_notes(label: str, lad) -> list:
    """What a recorded side's manifest says that changes how to read its verdict: the dtype
    it was recorded in (the rules are float32 rules) and steps read under other names."""
    meta = getattr(lad, "meta", None) or {}
    notes = []
    upcast = meta.get("upcast") or []
    dtype = (meta.get("producer") or {}).get("dtype")
    if upcast or (isinstance(dtype, str) and dtype not in ("float32", "float64")):
        what = dtype if isinstance(dtype, str) and dtype else "a half-precision dtype"
        notes.append(f"warning: {label} was recorded in {what} ({len(upcast)} tensors widened "
                     f"to float32 on reading); the rules are float32 rules, so failures may be "
                     f"the recording's rounding, not the port's")
    elif isinstance(dtype, str) and dtype:
        notes.append(f"{label}: recorded in {dtype[:20]} (producer.dtype)")
    renamed = meta.get("renamed_steps") or {}
    if renamed:
        pairs = ", ".join(f"{k} -> {v}" for k, v in list(renamed.items())[:4])
        more = f", ... ({len(renamed)} in all)" if len(renamed) > 4 else ""
        notes.append(f"{label}: steps matched by position and tokens, read as ours: "
                     f"{pairs}{more}")
    return notes


def check_recorded_argmax(cmp, a, b, labels) -> None:
    """A manifest's `argmax` ({step: argmax of its last position's logits}) is held to the
    recorded logits: a producer whose stored argmax disagrees with its own values wrote an
    inconsistent archive (exit 2 naming the step), whatever the comparison says."""
    last = {}
    for r in cmp.logits:
        if r.step not in last or r.pos > last[r.step].pos:
            last[r.step] = r
    for label, lad, attr in ((labels[0], a, "argmax_a"), (labels[1], b, "argmax_b")):
        stored = (getattr(lad, "meta", None) or {}).get("argmax") or {}
        for step, want in stored.items():
            r = last.get(step)
            if want is None or r is None:
                continue
            if not isinstance(want, int) or isinstance(want, bool) or want != getattr(r, attr):
                raise _err(f"compare: {label}: manifest field argmax[{step!r}] is "
                           f"{str(want)[:20]}, but its logits at position {r.pos} have argmax "
                           f"{getattr(r, attr)}: the archive contradicts itself")


def check_registry(sides, cfg) -> None:
    """Each side's names and shapes against the registry (points it lacks are reported by the
    comparison, as not traced or not compared)."""
    from ladder.model.names import TraceError
    from ladder.model.points import expected
    shapes = dict(expected(cfg))
    for label, lad in sides:
        shape_of = getattr(lad.values, "shape", None)       # an archive read lazily
        for key in lad.values:
            point = key.split("/", 1)[1]
            if point not in shapes:
                raise TraceError(f"{label}: {key} is not a point of the registry "
                                 f"(ladder/model/points.py)")
            shape = tuple(shape_of(key) if shape_of else lad.values[key].shape)[1:]
            if shape != shapes[point]:
                raise TraceError(f"{label}: {key} has shape {list(shape)} per position, "
                                 f"the registry says {list(shapes[point])}")


def project_version() -> str:
    try:
        from importlib.metadata import version
        return version("needle-parity")
    except Exception:                     # an uninstalled checkout
        return "0+checkout"
