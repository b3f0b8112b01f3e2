"""needle-rs's forward-parity fixture, read and written (STEM.json + STEM.f32).

The layout needle-rs's `tools/gen_v2_forward_parity.py` writes and its
`crates/needle-infer/tests/v2_forward_parity.rs` reads:

- `STEM.f32`: little-endian float32 values, back to back;
- `STEM.json`: `blob_index` {"{step}/{point}": {"offset" (in float32 elements), "shape"}},
  `steps` [{name, pos, tokens, blobs {point: key}, argmax}] (`prefill`, then `decode0`,
  `decode1`, ...; each decode step feeds the previous step's argmax), `prompt_ids`,
  `generated_ids`, `generated_text`, `prompt`, `source`, `max_len`, `kv_window`, and
  `geometry` (ladder/model/geometry.py's ten fields);
- only each step's last position; the coarse ladder (`embed`, `engram_k0`, `engram_v0`, per
  layer `hpre u bx y hpost hres x` and `alpha` ([1]) on Engram layers, `lane_mean`,
  `final_norm`, `logits`).

Reading maps their names onto the registry through ladder/formats/maps/needle-rs.toml; the points they
do not record are "not compared" with the map's reason. Every declared offset and shape is
checked against the file before a value is read, and every count against what a run can use
(ladder/engine/archive.py's MAX_POSITIONS and MAX_CELLS) before the values file is opened.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import torch

from bounded.size import DEFAULT_MAX_MEMORY
from ladder.engine.archive import MAX_CELLS, MAX_POSITIONS
from ladder.model.geometry import GeometryError, geometry_of, parse_geometry
from ladder.model.names import layer_of
from ladder.engine.trace import Ladder, schedule

MAX_MANIFEST = 64 * 1024 * 1024
MAX_BLOBS = 1 << 20
MAX_DIMS = 8
# needle-rs's emission order inside a layer: alpha is captured at the Engram gate, before the
# lane coefficients are recorded; the rest follow the layer's end.
LAYER_ORDER = ("alpha", "hpre", "u", "bx", "y", "hpost", "hres", "x")
HEAD = ("embed", "engram_k0", "engram_v0")
TAIL = ("lane_mean", "final_norm", "logits")


class NeedleRsError(ValueError):
    """A needle-rs fixture that is malformed or inconsistent (names the field and offset)."""


def is_needle_rs(stem) -> bool:
    """True when STEM.json and STEM.f32 both exist (the .json may be given with its suffix)."""
    stem = _stem(stem)
    return os.path.isfile(stem + ".json") and os.path.isfile(stem + ".f32")


def _stem(stem) -> str:
    stem = os.fspath(stem)
    for ext in (".json", ".f32"):
        if stem.endswith(ext):
            return stem[:-len(ext)]
    return stem


def _int(v, lo, hi, what, where) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise NeedleRsError(f"{where}: field {what}={str(v)[:40]} must be an integer in "
                            f"{lo}..{hi}")
    return v


def _ids(v, what, where, vocab) -> list:
    if not isinstance(v, list) or len(v) > MAX_BLOBS:
        raise NeedleRsError(f"{where}: field {what} must be a list of token ids")
    return [_int(t, 0, vocab - 1, f"{what}[{i}]", where) for i, t in enumerate(v)]


def _check_counts(m: dict, registry: list, js: str) -> None:
    """What the manifest declares, held to what a run can use before anything is read or
    built: a step is at least one position (MAX_POSITIONS), and each costs an entry per
    registry point (a value, or the map's reason it is absent: MAX_CELLS)."""
    n = len(m["steps"])
    if n > MAX_POSITIONS:
        raise NeedleRsError(f"{js}: field steps lists {n} steps; limit {MAX_POSITIONS} "
                            f"positions (MAX_POSITIONS)")
    if n * len(registry) > MAX_CELLS:
        raise NeedleRsError(f"{js}: field steps lists {n} steps x {len(registry)} registry "
                            f"points = {n * len(registry)} (step, point) cells; limit "
                            f"{MAX_CELLS} (MAX_CELLS: at most {MAX_CELLS // len(registry)} "
                            f"steps of this geometry)")
    if m.get("max_len") is not None:
        _int(m["max_len"], 0, MAX_POSITIONS, "max_len", js)
    for key in ("generated_ids", "prompt_ids"):
        if isinstance(m.get(key), list) and len(m[key]) > MAX_POSITIONS:
            raise NeedleRsError(f"{js}: field {key} holds {len(m[key])} ids; limit "
                                f"{MAX_POSITIONS} (MAX_POSITIONS)")


def read(stem, max_memory: int | None = None, name_map=None) -> Ladder:
    """The fixture as a last-position Ladder on the registry's names and our step names
    (`decode00`, ...); `ladder.meta` holds its manifest fields (not the blob index)."""
    from bounded.io import open_regular, parse_json, read_capped
    from ladder.formats.namemap import load_map, shape_value
    from ladder.model.points import expected
    stem = _stem(stem)
    js, fp = stem + ".json", stem + ".f32"
    nm = name_map or load_map("needle-rs")
    m = parse_json(read_capped(js, MAX_MANIFEST, NeedleRsError, "needle-rs manifest"), js,
                   NeedleRsError)
    if not isinstance(m, dict):
        raise NeedleRsError(f"{js}: manifest must be a JSON object")
    if "blob_index" not in m:
        # a .json + .f32 pair of some other layout: say what this reader is and the ways in
        raise NeedleRsError(
            f"{js}: no field blob_index, so {stem}.json + .f32 is not needle-rs's fixture "
            f"layout (ladder/formats/needle_rs.py). A port's values come in three ways: a trace "
            f"archive (one .safetensors with a needle_parity_trace manifest), needle-rs's "
            f"fixture (STEM.json with blob_index + STEM.f32), or your own safetensors names "
            f"with --map FILE.toml (docs/porting.md)")
    for key, kind in (("blob_index", dict), ("steps", list), ("geometry", dict),
                      ("kv_window", int), ("prompt_ids", list)):
        if not isinstance(m.get(key), kind) or isinstance(m.get(key), bool):
            raise NeedleRsError(f"{js}: field {key} is missing or not {kind.__name__}")
    try:
        geo = parse_geometry(m["geometry"], js)
    except GeometryError as e:
        raise NeedleRsError(str(e)) from None
    _int(m["kv_window"], 0, 1 << 30, "kv_window", js)
    registry = [n for n, _ in expected(geo)]
    _check_counts(m, registry, js)
    budget = DEFAULT_MAX_MEMORY if max_memory is None else max_memory
    f, size = open_regular(fp, budget, NeedleRsError, "needle-rs values")
    if size % 4:
        f.close()
        raise NeedleRsError(f"{fp}: {size} bytes is not a whole number of float32 values")
    n_floats = size // 4
    index = m["blob_index"]
    if len(index) > MAX_BLOBS:
        f.close()
        raise NeedleRsError(f"{js}: field blob_index holds {len(index)} entries; limit "
                            f"{MAX_BLOBS}")
    spans = {}
    for key, e in index.items():
        at = f"{js}: blob_index[{key[:60]!r}]"
        if not isinstance(e, dict) or not isinstance(e.get("shape"), list) \
                or len(e["shape"]) > MAX_DIMS:
            f.close()
            raise NeedleRsError(f"{at}: needs offset and a shape of at most {MAX_DIMS} dims")
        off = _int(e.get("offset"), 0, n_floats, "offset", at)
        # a dimension of 0 would hold no value, where the reader below counts one (as [])
        shape = [_int(d, 1, n_floats, f"shape[{i}]", at) for i, d in enumerate(e["shape"])]
        count = max(math.prod(shape), 1)            # as the Rust reader: [] holds one value
        if off + count > n_floats:
            f.close()
            raise NeedleRsError(f"{at}: offset {off} + {count} values runs past the "
                                f"{n_floats} float32 values of {fp} (byte {4 * (off + count)} "
                                f"> {size})")
        spans[key] = (off, count, shape)
    with f:
        buf = np.empty(n_floats, dtype="<f4")           # little-endian on any host
        if n_floats and f.readinto(buf) != size:
            raise NeedleRsError(f"{fp}: shorter than its {size} bytes (changed while read)")
    raw = torch.from_numpy(buf.astype(np.float32, copy=False))
    steps_in = m["steps"]
    if not steps_in:
        raise NeedleRsError(f"{js}: field steps is empty")
    tokens, plan, n_blobs = [], [], 0
    for i, s in enumerate(steps_in):
        at = f"{js}: steps[{i}]"
        if not isinstance(s, dict) or not isinstance(s.get("name"), str) \
                or not isinstance(s.get("tokens"), list) or not isinstance(s.get("blobs"), dict):
            raise NeedleRsError(f"{at}: needs name, pos, tokens and blobs")
        kind = nm.step_of(s["name"])
        want = ("prefill", None) if i == 0 else ("decode", i - 1)
        if kind != want:
            raise NeedleRsError(f"{at}: field name={s['name'][:40]!r}; expected the "
                                f"{'prefill' if i == 0 else f'decode step {i - 1}'} here")
        _int(s.get("pos"), len(tokens), len(tokens), "pos", at)
        if len(s["tokens"]) > MAX_POSITIONS - len(tokens):
            raise NeedleRsError(f"{at}: field tokens holds {len(s['tokens'])} ids, past "
                                f"{MAX_POSITIONS} positions in all (MAX_POSITIONS)")
        if not s["blobs"]:
            # a step its writer skipped: a broken file, not a port whose every point diverges
            raise NeedleRsError(f"{at}: field blobs of step {s['name'][:40]!r} is empty: the "
                                f"step records none of its points")
        n_blobs += len(s["blobs"])
        if n_blobs > MAX_CELLS:               # each blob named costs a view and a reshape
            raise NeedleRsError(f"{at}: field blobs brings the steps' blobs to {n_blobs}; "
                                f"limit {MAX_CELLS} (MAX_CELLS)")
        toks = _ids(s["tokens"], "tokens", at, geo.vocab_size)
        if not toks or (i and len(toks) != 1):
            raise NeedleRsError(f"{at}: field tokens holds {len(toks)} ids; the prefill needs "
                                f"at least one, a decode step exactly one")
        tokens += toks
        plan.append(s)
    steps = schedule(tokens, len(plan[0]["tokens"]))
    prompt_ids = _ids(m["prompt_ids"], "prompt_ids", js, geo.vocab_size)
    if prompt_ids != list(steps[0].tokens):
        raise NeedleRsError(f"{js}: field prompt_ids differs from steps[0].tokens")
    values, hidden = {}, {}
    # the map's reason per point, once: it does not depend on the step
    why_not = {p: nm.why_not_emitted(p, geo.num_layers) for p in registry}
    for st, s in zip(steps, plan):
        got = {}
        for theirs, key in s["blobs"].items():
            if not isinstance(key, str) or key not in spans:
                raise NeedleRsError(f"{js}: steps {s['name']!r} blob {theirs!r} names "
                                    f"{str(key)[:60]!r}, which blob_index lacks")
            ours, _ = nm.point_of(theirs)
            if ours is None:
                continue
            off, count, shape = spans[key]
            v = raw[off:off + count].reshape(1, *shape) if shape else raw[off:off + 1]
            got[ours] = shape_value(v, ours, geo, nm, f"{js}: {key}")
        for point in registry:
            if point in got:
                values[f"{st.name}/{point}"] = got.pop(point)
            elif why_not[point] is not None:
                hidden[f"{st.name}/{point}"] = why_not[point]
        for point, v in got.items():            # outside the registry: kept, reported there
            values[f"{st.name}/{point}"] = v
    meta = {k: m.get(k) for k in ("source", "prompt", "prompt_ids", "generated_ids",
                                  "generated_text", "max_len", "kv_window")}
    meta.update(format="needle-rs", geometry=geo.to_dict(),
                argmax={st.name: s.get("argmax") for st, s in zip(steps, plan)},
                schedule={"tokens": tokens, "prompt_len": len(steps[0].tokens)},
                producer={"name": "needle-rs fixture", "version": "", "backend": "",
                          "device": "", "dtype": "float32"})
    return Ladder(steps, values, f"needle-rs fixture {os.path.basename(stem)}", hidden, "last",
                  meta)


def their_point(point: str) -> str | None:
    """Our registry name as needle-rs records it, or None when it does not."""
    layer = layer_of(point)
    if layer is not None:
        return point if point.split(".", 1)[1] in LAYER_ORDER else None
    return point if point in HEAD + TAIL else None


def write(stem, ladder: Ladder, *, cfg, kv_window: int, source: str, prompt: str,
          generated_ids: list, generated_text: str, max_len: int) -> tuple:
    """Write `ladder` (the reference's, any capture) as needle-rs's fixture: last positions,
    their step names and points; (json path, f32 path), written all or nothing."""
    stem = _stem(stem)
    lad = ladder.last_only()
    blobs, index, steps = bytearray(), {}, []
    for i, st in enumerate(lad.steps):
        name = "prefill" if i == 0 else f"decode{i - 1}"
        order = list(HEAD)
        for layer in range(cfg.num_layers):
            order += [f"L{layer:02d}.{p}" for p in LAYER_ORDER
                      if p != "alpha" or cfg.site_of_layer(layer) is not None]
        order += list(TAIL)
        entry = {"name": name, "pos": st.pos, "tokens": [int(t) for t in st.tokens], "blobs": {}}
        for point in order:
            v = lad.values[f"{st.name}/{point}"][0].to(torch.float32)
            if point.endswith(".alpha"):
                v = v.reshape(1)                       # their alpha[0, -1:]
            key = f"{name}/{point}"
            index[key] = {"offset": len(blobs) // 4, "shape": list(v.shape)}
            blobs += v.contiguous().numpy().astype("<f4").tobytes()
            entry["blobs"][point] = key
        entry["argmax"] = int(torch.argmax(lad.values[f"{st.name}/logits"][0]))
        steps.append(entry)
    manifest = {"source": source, "prompt": prompt, "prompt_ids": list(lad.steps[0].tokens),
                "max_len": int(max_len), "kv_window": int(kv_window),
                "generated_ids": [int(t) for t in generated_ids],
                "generated_text": generated_text, "geometry": geometry_of(cfg),
                "blob_index": index, "steps": steps}
    js, fp = stem + ".json", stem + ".f32"
    os.makedirs(os.path.dirname(os.path.abspath(js)), exist_ok=True)
    try:
        with open(js + ".tmp", "w", encoding="utf-8") as f:
            json.dump(manifest, f)
        with open(fp + ".tmp", "wb") as f:
            f.write(bytes(blobs))
        os.replace(fp + ".tmp", fp)
        os.replace(js + ".tmp", js)
    finally:
        for p in (js + ".tmp", fp + ".tmp"):
            if os.path.exists(p):
                os.unlink(p)
    return js, fp
