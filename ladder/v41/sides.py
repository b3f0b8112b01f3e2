"""The DeepSeek-V4.1 attention ladder: the fixture, both sides driven over it, and their
comparison as the ladder's own `Comparison` (ladder/engine/compare.py), so tables, reports and
locate are the needle v2 ones. The commands are in ladder/v41/cli.py.

Comparisons over the committed fixture of DeepSeek's own V4.1 code (tools/
gen_v41_attn_fixture.py), each layer by layer from the official inputs (index selections flip
under one-ulp changes, so a free-running comparison would test the chain, not the layer):

  v41_official  reference/v41/attn.py vs the official recordings
  v41_port      port/v41/attn.py (eager, backend and device as asked) vs the reference

A ladder step is one fixture call (named by its key, at its start position, m positions
wide); a point is "L{layer:02d}.{name}", and rules match "{side}/L{layer:02d}.{name}". Index
tensors (window_idxs, topk_idxs) take the exact rule, the rest ladder/engine/rules.py's V41_RULES
bound. The first divergence is the earliest failing (call, layer, point) in forward order.
"""
from __future__ import annotations

import os

import torch

from reference.v41.config import V41Args, V41ConfigError, short_repr, mtp_weight_names

from ladder.engine.compare import Comparison, as_ruleset, compare_ladders
from ladder.engine.rules import V41_RULESET, RulesError
from ladder.engine.trace import Ladder, Step, point_name

DEFAULT_STEM = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
                                os.path.abspath(__file__)))), "tests", "fixtures", "attn_v41_official")
POINTS = ("qr", "q", "kv", "window_idxs", "latent", "index_q", "compressed_rows", "topk_idxs",
          "o", "o_rot", "og", "out")
INDEX_POINTS = ("window_idxs", "topk_idxs")
MAX_FIXTURE = 16 * 1024 * 1024


class V41FixtureError(ValueError):
    """A V4.1 fixture that cannot be used (names the file, the field and the limit)."""


def load_fixture(stem: str = DEFAULT_STEM, max_memory: int | None = None):
    """(manifest, recordings {call: {layer: {point: tensor}}}, weights {official name: tensor}).

    Both files go through the project's bounded readers (regular files only, reads capped at
    MAX_FIXTURE, JSON nesting and numbers bounded, the safetensors framing checked before any
    tensor is allocated); every structural problem raises V41FixtureError naming file and field.
    model_args are typed and ranged (V41Args), the calls checked against them, what the
    geometry implies held to `max_memory` (--max-memory), and every weight and recorded input
    shaped as the geometry says."""
    from reference.params import load_safetensors
    from bounded.io import load_json
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
    try:
        args = V41Args.from_any(man["model_args"])
    except (V41ConfigError, TypeError, ValueError) as e:
        raise V41FixtureError(f"{paths[0]}: model_args: {e}") from None
    _check_calls(man["calls"], args, paths[0])
    _check_labels(man, paths[0])
    check_v41_memory(args, man["calls"], max_memory, f"{paths[0]}: model_args")
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
    missing = [c["key"] for c in man["calls"] if c["key"] not in rec]
    if missing:
        raise V41FixtureError(f"{paths[1]}: no recordings for calls {missing[:3]}")
    _check_tensors(args, man["calls"], rec, weights, paths[1])
    return man, rec, weights


MAX_CALLS = 4096      # the committed fixture has 48


def _check_calls(calls, a: V41Args, where: str) -> None:
    """Every call an object {key: str, start_pos: int, m: int} inside max_seq_len, keys
    distinct, at least one call and at most MAX_CALLS."""
    if not calls:
        raise V41FixtureError(f"{where}: manifest field 'calls' is empty (a fixture with no "
                              f"calls compares nothing)")
    if len(calls) > MAX_CALLS:
        raise V41FixtureError(f"{where}: manifest field 'calls' has {len(calls)} entries, over "
                              f"the limit {MAX_CALLS}")
    seen = set()
    for i, c in enumerate(calls):
        if not isinstance(c, dict) or not isinstance(c.get("key"), str):
            raise V41FixtureError(f"{where}: calls[{i}] must be an object with a string "
                                  f"'key'")
        if c["key"] in seen:
            raise V41FixtureError(f"{where}: calls[{i}] field key={c['key']!r} repeats an "
                                  f"earlier call's key")
        seen.add(c["key"])
        for name, lo, hi in (("start_pos", 0, a.max_seq_len - 1), ("m", 1, a.max_seq_len)):
            v = c.get(name)
            if not (isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi):
                raise V41FixtureError(f"{where}: calls[{i}] field {name}={v!r} must be an "
                                      f"integer in {lo}..{hi} (max_seq_len="
                                      f"{a.max_seq_len})")
        if c["start_pos"] + c["m"] > a.max_seq_len:
            raise V41FixtureError(f"{where}: calls[{i}] start_pos={c['start_pos']} + m={c['m']}"
                                  f" exceeds max_seq_len={a.max_seq_len}")
        if c["start_pos"] > 0 and c["m"] != 1:
            raise V41FixtureError(f"{where}: calls[{i}] start_pos={c['start_pos']} > 0 takes "
                                  f"one token (a decode step), not m={c['m']}")


def _check_labels(man: dict, where: str) -> None:
    """The fields the run prints: `official` maps names to strings (or null), `scenarios`
    (optional) is a list of objects with a string `name`."""
    for k, v in man["official"].items():
        if v is not None and not isinstance(v, str):
            raise V41FixtureError(f"{where}: official field {k}={short_repr(v)} must be a string")
    sc = man.get("scenarios", [])
    if not isinstance(sc, list) or len(sc) > MAX_CALLS or not all(
            isinstance(x, dict) and isinstance(x.get("name"), str) for x in sc):
        raise V41FixtureError(f"{where}: manifest field 'scenarios' must be a list of at most "
                              f"{MAX_CALLS} objects with a string 'name'")


def weight_shapes(a: V41Args, layer: int) -> dict:
    """{name under "layers.{i}.attn.": (shape, dtype)} of what layer `layer`'s role reads, as
    the official checkpoint stores them (attn_sink and a ratio > 1 compressor's projections
    float32, the rest bfloat16)."""
    role = a.role(layer)
    bf, f32 = torch.bfloat16, torch.float32
    hd, d, q, og = a.head_dim, a.dim, a.q_lora_rank, a.o_groups * a.o_lora_rank
    s = {"attn_sink": ((a.n_heads,), f32), "wq_a.weight": ((q, d), bf),
         "q_norm.weight": ((q,), bf), "wq_b.weight": ((a.n_heads * hd, q), bf),
         "wkv.weight": ((hd, d), bf), "kv_norm.weight": ((hd,), bf),
         "wo_a.weight": ((og, a.n_heads * hd // a.o_groups), bf), "wo_b.weight": ((d, og), bf)}
    if role.is_kv_source:
        # ratio 1 projects the bf16 tokens directly; above it the pooling runs in float32
        s["compressor.wkv.weight"] = ((hd, d), f32 if role.ratio > 1 else bf)
        s["compressor.norm.weight"] = ((hd,), bf)
        if role.ratio > 1:
            s["compressor.wgate.weight"] = ((hd, d), f32)
    if role.is_index_source:
        s["indexer.wq_b.weight"] = ((a.index_n_heads * a.index_head_dim, q), bf)
        s["indexer.weights_proj.weight"] = ((a.index_n_heads, d), bf)
        if role.is_kv_source:
            s["indexer.wk.weight"] = ((a.index_head_dim, hd), bf)
            s["indexer.k_norm.weight"] = ((a.index_head_dim,), bf)
    return s


def _check_tensors(a: V41Args, calls, rec, weights, where: str) -> None:
    """The weights each layer reads and the recorded layer inputs, shaped and typed as the
    geometry says, so no matmul meets a tensor of another size."""
    def check(name, t, shape, dtype):
        if t is None:
            raise V41FixtureError(f"{where}: no tensor {name!r} (the geometry needs it, "
                                  f"shape {list(shape)})")
        if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
            raise V41FixtureError(f"{where}: tensor {name!r} is {str(t.dtype)[6:]} "
                                  f"{list(t.shape)}; model_args need {str(dtype)[6:]} "
                                  f"{list(shape)}")
    for i in range(a.n_layers):
        for n, (shape, dtype) in weight_shapes(a, i).items():
            check(f"w/layers.{i}.attn.{n}", weights.get(f"layers.{i}.attn.{n}"), shape, dtype)
    base = weight_shapes(a, 0)
    for k in range(a.n_mtp_layers):
        for n in mtp_weight_names(k):
            if n in weights:
                shape, dtype = base[n.split(".attn.", 1)[1]]
                check(f"w/{n}", weights[n], shape, dtype)
    for c in calls:
        for i in range(a.n_layers):
            x = rec[c["key"]].get(i, {}).get("x")
            check(f"{c['key']}/L{i}/x", x, (c["m"], a.dim), torch.bfloat16)


def implied_bytes(a: V41Args, calls) -> dict:
    """{term: (bytes, fields)}: what a V4.1 run allocates from the geometry (three runtimes:
    the reference, the eager port and the graph port), before any of it is allocated."""
    runtimes, bf = 3, 2
    ratios = [a.compress_ratios[i] for i in a.kv_sources]
    cache_rows = sum(a.max_seq_len // r for r in ratios if r)
    m = max(c["m"] for c in calls)
    span = max(c["start_pos"] + c["m"] for c in calls)
    sel = a.window_size + a.index_topk      # the rows one query gathers
    return {
        "RoPE tables": (runtimes * 2 * a.max_seq_len * (a.rope_head_dim // 2) * 16,
                        "max_seq_len/rope_head_dim"),
        "window rings": (runtimes * a.n_layers * a.window_size * a.head_dim * bf,
                         "n_layers/window_size/head_dim"),
        "compressed caches": (runtimes * cache_rows * (a.head_dim + a.index_head_dim) * bf,
                              "max_seq_len/compress_ratios"),
        # a compressor holds the rows of one block, `ratio` of them, pooled in float32 (values
        # and scores), for the kv and the index head
        "compressor states": (runtimes * sum(r for r in ratios if r > 1)
                              * (a.head_dim + a.index_head_dim) * 4 * 2,
                              "compress_ratios/head_dim"),
        "output rows": (runtimes * a.max_seq_len * a.dim * bf, "max_seq_len/dim"),
        "attention tiles": (m * sel * a.n_heads * a.head_dim * 4 * 4,
                            "window_size/index_topk/n_heads/head_dim"),
        # a query scores the keys of the positions written so far: (start_pos + m) // ratio
        "index scores": (m * span * a.index_n_heads * 4 * 4, "index_n_heads/max_seq_len"),
    }


def check_v41_memory(a: V41Args, calls, budget, where: str) -> int:
    """The total of implied_bytes, or V41FixtureError naming the largest term and its fields
    when it exceeds `budget` (reference.memory_budget.DEFAULT_MAX_MEMORY when None;
    --max-memory)."""
    from bounded.size import DEFAULT_MAX_MEMORY, fmt_bytes as fmt
    budget = DEFAULT_MAX_MEMORY if budget is None else int(budget)
    terms = implied_bytes(a, calls)
    total = sum(b for b, _ in terms.values())
    if total <= budget:
        return total
    name, (nbytes, flds) = max(terms.items(), key=lambda kv: kv[1][0])
    values = ", ".join(f"{f}={short_repr(getattr(a, f))}" for f in flds.split("/"))
    raise V41FixtureError(f"{where}: the geometry implies {fmt(total)}, over the memory "
                          f"budget of {fmt(budget)} (--max-memory); the largest is the "
                          f"{name}, {fmt(nbytes)} from {values}")


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
    ladder/engine/rules.py's V41_RULES): the ladder's own Comparison, one row per (call, point)."""
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
