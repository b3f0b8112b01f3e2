"""A safetensors file in another implementation's names (no manifest of ours), read through a
name map (ladder/formats/namemap.py): upstream's own JAX capture is the shipped example.

Keys are `{prefix}{step}/{point}` with the map's step and point names; the token ids are the
map's `tokens` key (rows of a batch: the map's `batch_row`). The schedule is the map's steps
in order: the prefill (its positions read off the values' position axis), then one-token
decode steps. Keys outside the prefix are other data and are left alone; a key inside it that
the map does not cover is an error naming it.
"""
from __future__ import annotations

import os

from bounded.safetensors import load_safetensors
from ladder.model.names import TraceError
from ladder.engine.trace import Ladder, schedule


def read_mapped(path, nm, max_memory=None) -> Ladder:
    from ladder.formats.namemap import NameMapError
    where = os.fspath(path)
    tensors, _ = load_safetensors(path, max_memory, error=NameMapError)
    if nm.tokens not in tensors:
        raise NameMapError(f"{where}: no tensor {nm.tokens!r} (the map {nm.name!r} reads the "
                           f"token ids there)")
    toks = tensors[nm.tokens]
    if nm.batch_row >= 0:
        if toks.dim() != 2 or not 0 <= nm.batch_row < toks.shape[0]:
            raise NameMapError(f"{where}: tensor {nm.tokens!r} {list(toks.shape)} has no batch "
                               f"row {nm.batch_row}")
        toks = toks[nm.batch_row]
    by_step = {}
    for key, v in tensors.items():
        if not key.startswith(nm.prefix) or key == nm.tokens:
            continue
        rest = key[len(nm.prefix):]
        if "/" not in rest:
            continue                                    # other data beside the ladder
        step, point = rest.split("/", 1)
        kind = nm.step_of(step)
        if kind is None:
            raise NameMapError(f"{where}: key {key!r}: step {step!r} is neither the map's "
                               f"prefill {nm.prefill!r} nor its decode {nm.decode!r}")
        ours, rule = nm.point_of(point)
        if ours is None:
            continue
        if nm.batch_row >= 0:
            v = v[nm.batch_row]
        if rule.positions_axis:
            v = v.movedim(rule.positions_axis, 0)
        by_step.setdefault(kind, {})[ours] = v.float().contiguous()
    if ("prefill", None) not in by_step:
        raise NameMapError(f"{where}: no {nm.prefix}{nm.prefill}/... values")
    prompt = next(iter(by_step[("prefill", None)].values())).shape[0]
    n_dec = max((i for k, i in by_step if k == "decode"), default=-1) + 1
    tokens = [int(t) for t in toks[:prompt + n_dec]]
    if len(tokens) < prompt + n_dec:
        raise TraceError(f"{where}: {len(tokens)} token ids, the steps need {prompt + n_dec}")
    steps = schedule(tokens, prompt)
    values, hidden = {}, {}
    for j, st in enumerate(steps):
        got = by_step.get(("prefill", None) if j == 0 else ("decode", j - 1), {})
        for point, v in got.items():
            values[f"{st.name}/{point}"] = v
    lad = Ladder(steps, values, f"{nm.name} {os.path.basename(where)}", hidden, nm.captured,
                 {"format": nm.name, "producer": {"name": nm.name}})
    lad.meta["not_emitted_map"] = nm
    if nm.precision is not None:
        lad.meta["precision"] = nm.precision
    return lad


def fill_not_emitted(lad: Ladder, cfg) -> None:
    """Once the model's geometry is known: a mapped file's values reshaped to the registry's
    shapes (the map's `reshape = "registry"`: flat <-> shaped), and the registry points it
    lacks that its map declares not emitted made "not compared", with the map's reason (the
    others stay missing, and fail as such)."""
    nm = lad.meta.pop("not_emitted_map", None)
    if nm is None:
        return
    from ladder.formats.namemap import shape_value
    for key in list(lad.values):
        point = key.split("/", 1)[1]
        lad.values[key] = shape_value(lad.values[key], point, cfg, nm, lad.label)
    from ladder.model.points import expected
    for st in lad.steps:
        for point, _ in expected(cfg):
            key = f"{st.name}/{point}"
            if key not in lad.values:
                why = nm.why_not_emitted(point, cfg.num_layers)
                if why is not None:
                    lad.hidden[key] = why
