"""The DeepSeek-V4.1 attention ladder: the fixture, both sides driven over it, and their
comparison as the ladder's own `Comparison` (ladder/compare.py), so tables, reports and
locate are the needle v2 ones. The commands are in ladder/v41_cli.py.

Comparisons over the committed fixture of DeepSeek's own V4.1 code (tools/
gen_v41_attn_fixture.py), each layer by layer from the official inputs (index selections flip
under one-ulp changes, so a free-running comparison would test the chain, not the layer):

  v41_official  reference/v41/attn.py vs the official recordings
  v41_port      port/v41/attn.py (eager, backend and device as asked) vs the reference

A ladder step is one fixture call (named by its key, at its start position, m positions
wide); a point is "L{layer:02d}.{name}", and rules match "{side}/L{layer:02d}.{name}". Index
tensors (window_idxs, topk_idxs) take the exact rule, the rest ladder/rules.py's V41_RULES
bound. The first divergence is the earliest failing (call, layer, point) in forward order.
"""
from __future__ import annotations

import os

import torch

from reference.v41.config import V41Args, V41ConfigError

from .compare import Comparison, as_ruleset, compare_ladders
from .rules import V41_RULESET, RulesError
from .trace import Ladder, Step, point_name

DEFAULT_STEM = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "tests", "fixtures", "attn_v41_official")
POINTS = ("qr", "q", "kv", "window_idxs", "latent", "index_q", "compressed_rows", "topk_idxs",
          "o", "o_rot", "og", "out")
INDEX_POINTS = ("window_idxs", "topk_idxs")
MAX_FIXTURE = 16 * 1024 * 1024


class V41FixtureError(ValueError):
    """A V4.1 fixture that cannot be used (names the file, the field and the limit)."""


def load_fixture(stem: str = DEFAULT_STEM):
    """(manifest, recordings {call: {layer: {point: tensor}}}, weights {official name: tensor}).

    Both files go through the project's bounded readers (regular files only, reads capped at
    MAX_FIXTURE, JSON nesting and numbers bounded, the safetensors framing checked before any
    tensor is allocated); every structural problem raises V41FixtureError naming file and field."""
    from reference.params import load_safetensors
    from reference.safe_io import load_json
    paths = (stem + ".json", stem + ".safetensors")
    for p in paths:
        if not os.path.exists(p):
            raise V41FixtureError(f"{p}: no such fixture file")
    man = load_json(paths[0], MAX_FIXTURE, V41FixtureError, "V4.1 fixture manifest")
    if not isinstance(man, dict):
        raise V41FixtureError(f"{paths[0]}: manifest is a JSON {type(man).__name__}, "
                              f"not an object")
    for field, kind in (("model_args", dict), ("calls", list), ("official", dict)):
        if field not in man:
            raise V41FixtureError(f"{paths[0]}: manifest lacks field {field!r}")
        if not isinstance(man[field], kind):
            raise V41FixtureError(f"{paths[0]}: manifest field {field!r} must be a JSON "
                                  f"{'object' if kind is dict else 'array'} "
                                  f"(got {type(man[field]).__name__})")
    for i, c in enumerate(man["calls"]):
        if not isinstance(c, dict) or not isinstance(c.get("key"), str):
            raise V41FixtureError(f"{paths[0]}: calls[{i}] must be an object with a string "
                                  f"'key'")
    raw, _ = load_safetensors(paths[1], MAX_FIXTURE, error=V41FixtureError)
    weights = {k[2:]: v for k, v in raw.items() if k.startswith("w/")}
    rec = {}
    for k, v in raw.items():
        if k.startswith("w/"):
            continue
        parts = k.split("/")
        if len(parts) != 3 or not parts[1].startswith("L") or not parts[1][1:].isdigit():
            raise V41FixtureError(f"{paths[1]}: tensor name {k!r} is neither 'w/NAME' nor "
                                  f"'CALL/L<layer>/POINT'")
        call, layer, point = parts
        rec.setdefault(call, {}).setdefault(int(layer[1:]), {})[point] = v
    try:
        V41Args.from_any(man["model_args"])
    except (V41ConfigError, TypeError, ValueError) as e:
        raise V41FixtureError(f"{paths[0]}: model_args: {e}") from None
    missing = [c["key"] for c in man["calls"] if c["key"] not in rec]
    if missing:
        raise V41FixtureError(f"{paths[1]}: no recordings for calls {missing[:3]}")
    return man, rec, weights


def run_side(stack, man, rec, calls=None, layers=None):
    """Drive `stack` (reference or port) over the fixture's calls from the official inputs:
    {call: {layer: {point: tensor}}}. Every layer runs (sources publish for consumers); only
    `layers` are kept."""
    out = {}
    n_layers = V41Args.from_any(man["model_args"]).n_layers
    for c in man["calls"] if calls is None else calls:
        for layer in range(n_layers):
            got = {}
            stack.forward(layer, rec[c["key"]][layer]["x"], c["start_pos"],
                          trace=lambda name, lay, v, got=got: got.__setitem__(
                              name, v.detach().to("cpu", copy=True)))
            if layers is None or layer in layers:
                out.setdefault(c["key"], {})[layer] = got
    return out


def steps_of(calls) -> list:
    """The fixture's calls as ladder steps: one per call, at its start position, m wide."""
    return [Step(c["key"], int(c["start_pos"]), (0,) * int(c["m"])) for c in calls]


def to_ladder(run, calls, label: str) -> Ladder:
    """{call: {layer: {point: tensor}}} -> a Ladder keyed "{call}/L{layer:02d}.{point}", in
    forward order (calls, layers, POINTS); floats as float32 (bf16 widens exactly), indices as
    int64. The recorded layer input `x` is an input, not a point."""
    lad = Ladder(steps_of(calls), label=label)
    for c in calls:
        for layer, points in sorted(run.get(c["key"], {}).items()):
            for name in POINTS:
                v = points.get(name)
                if v is not None:
                    v = v.detach().to("cpu")
                    v = v.long() if name in INDEX_POINTS else v.float()
                    lad.values[f"{c['key']}/{point_name(name, layer)}"] = v
    return lad


def compare(a, b, side: str, calls, rules=None, a_label=None, b_label=None) -> Comparison:
    """`a` (the candidate) against `b` (the side whose magnitudes scale the bounds) over
    `calls` (manifest call dicts), under `rules` matched on "{side}/L{layer}.{point}" (default
    ladder/rules.py's V41_RULES): the ladder's own Comparison, one row per (call, point)."""
    rs = V41_RULESET if rules is None else as_ruleset(rules)
    la = to_ladder(a, calls, a_label or side.split("_", 1)[-1])
    lb = to_ladder(b, calls, b_label or "reference")
    try:
        return compare_ladders(la, lb, rs, prefix=side, a_label=la.label, b_label=lb.label)
    except KeyError as e:                     # a rules file with no pattern for some point
        raise RulesError(f"{rs.source}: {e.args[0]}") from None


def graph_vs_eager(eager_port, graph_port, man, rec, eager_run=None):
    """(layer-steps compared, mismatches): decode="graph" output bytes vs decode="eager" on
    every capturable decode layer-step of the fixture. On decode steps each run of consecutive
    capturable layers goes through forward_segment (one graph per run on CUDA, both selection
    classes in it), the other layers through forward. `eager_run` (run_side's result for an
    eager port over all calls) stands in for running `eager_port` again."""
    n, bad = 0, []
    n_layers = V41Args.from_any(man["model_args"]).n_layers
    runs = {run[0]: run for run in graph_port.segments()}
    for c in man["calls"]:
        key, pos = c["key"], c["start_pos"]

        def eager(layer):
            return (eager_port.forward(layer, rec[key][layer]["x"], pos) if eager_run is None
                    else eager_run[key][layer]["out"]).cpu()
        layer = 0
        while layer < n_layers:
            run = runs.get(layer) if pos > 0 else None
            if run is None:
                eager(layer)
                graph_port.forward(layer, rec[key][layer]["x"], pos)
                layer += 1
                continue
            got = graph_port.forward_segment(run, torch.cat([rec[key][i]["x"] for i in run]),
                                             pos).cpu()
            for j, i in enumerate(run):
                n += 1
                if not torch.equal(eager(i), got[j:j + 1]):
                    bad.append((key, i))
            layer += len(run)
    return n, bad
