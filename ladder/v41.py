"""The DeepSeek-V4.1 attention ladder (`python -m ladder run --model attn_v41`, issue #8).

Three comparisons over the committed fixture of DeepSeek's own V4.1 code (tools/
gen_v41_attn_fixture.py), each layer by layer from the official inputs (index selections flip
under one-ulp changes, so a free-running comparison would test the chain, not the layer):

  v41_official  reference/attn_v41.py vs the official recordings
  v41_port      port/attn_v41.py (eager, backend and device as asked) vs the reference
  graph bytes   always (whatever --decode says): with decode="graph", every capturable
                layer-step's output vs the eager port's, torch.equal. On CUDA that is real
                capture and replay; without CUDA the capturable body runs eagerly on the static
                buffers, and the report line says so (capture+replay: tests/test_attn_v41_cuda.py)

Points are "{side}/L{layer}.{name}"; index tensors (window_idxs, topk_idxs) must be equal, the
rest pass ladder/rules.py's V41_RULES. The first divergence is the earliest failing
(call, layer, point) in forward order.
"""
from __future__ import annotations

import json
import os
import time

import torch
from safetensors.torch import load_file

from reference.config_v41 import V41Args

from .rules import V41_RULES, rule_for

DEFAULT_STEM = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "tests", "fixtures", "attn_v41_official")
POINTS = ("qr", "q", "kv", "window_idxs", "latent", "index_q", "compressed_rows", "topk_idxs",
          "o", "o_rot", "og", "out")
INDEX_POINTS = ("window_idxs", "topk_idxs")
MAX_FIXTURE = 16 * 1024 * 1024


class V41FixtureError(ValueError):
    """A V4.1 fixture that cannot be used (names the file, the field and the limit)."""


def load_fixture(stem: str = DEFAULT_STEM):
    """(manifest, recordings {call: {layer: {point: tensor}}}, weights {official name: tensor})."""
    paths = (stem + ".json", stem + ".safetensors")
    for p in paths:
        if not os.path.isfile(p):
            raise V41FixtureError(f"{p}: no such fixture file")
        if os.path.getsize(p) > MAX_FIXTURE:
            raise V41FixtureError(f"{p}: {os.path.getsize(p)} bytes exceeds {MAX_FIXTURE}")
    with open(paths[0]) as f:
        man = json.load(f)
    for field in ("model_args", "calls", "official"):
        if field not in man:
            raise V41FixtureError(f"{paths[0]}: manifest lacks field {field!r}")
    raw = load_file(paths[1])
    weights = {k[2:]: v for k, v in raw.items() if k.startswith("w/")}
    rec = {}
    for k, v in raw.items():
        if k.startswith("w/"):
            continue
        call, layer, point = k.split("/")
        rec.setdefault(call, {}).setdefault(int(layer[1:]), {})[point] = v
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


def compare(a, b, side: str, order):
    """Rows (call, layer, point, passed, ratio, max_abs) for every point b has, in forward
    order; a point missing from a fails. ratio = max|a-b| / allowance (0/1 for indices)."""
    rows = []
    for call in order:
        for layer in sorted(b.get(call, {})):
            for point in POINTS:
                want = b[call][layer].get(point)
                if want is None:
                    continue
                got = a.get(call, {}).get(layer, {}).get(point)
                name = f"{side}/L{layer}.{point}"
                if got is None or tuple(got.shape) != tuple(want.shape):
                    rows.append((call, layer, point, False, float("inf"), float("inf")))
                    continue
                if point in INDEX_POINTS:
                    same = torch.equal(got.to(torch.int64), want.to(torch.int64))
                    rows.append((call, layer, point, same, 0.0 if same else float("inf"),
                                 0.0 if same else float((got.long() - want.long()).abs().max())))
                    continue
                if not want.numel():
                    rows.append((call, layer, point, True, 0.0, 0.0))
                    continue
                r = rule_for(name, V41_RULES).error(got, want)
                diff = float((got.double() - want.double()).abs().max())
                rows.append((call, layer, point, r <= 1.0, r, diff))
    return rows


def graph_vs_eager(eager_port, graph_port, man, rec, eager_run=None):
    """(layer-steps compared, mismatches): decode="graph" output bytes vs decode="eager" on
    every capturable decode layer-step of the fixture. `eager_run` (run_side's result for an
    eager port over all calls) stands in for running `eager_port` again."""
    n, bad = 0, []
    n_layers = V41Args.from_any(man["model_args"]).n_layers
    for c in man["calls"]:
        for layer in range(n_layers):
            x = rec[c["key"]][layer]["x"]
            e = eager_port.forward(layer, x, c["start_pos"]) if eager_run is None \
                else eager_run[c["key"]][layer]["out"]
            g = graph_port.forward(layer, x, c["start_pos"])
            if c["start_pos"] > 0 and graph_port.decode_capturable(layer):
                n += 1
                if not torch.equal(e.cpu(), g.cpu()):
                    bad.append((c["key"], layer))
    return n, bad


def summary(rows):
    """{(side-less) point: (worst ratio, worst max_abs, where)} over all rows."""
    out = {}
    for call, layer, point, ok, ratio, diff in rows:
        cur = out.get(point)
        if cur is None or ratio > cur[0]:
            out[point] = (ratio, diff, f"{call}/L{layer}")
    return out


def _table(title, rows, out):
    out(f"{title}: {sum(r[3] for r in rows)}/{len(rows)} points pass")
    out(f"  {'point':16s} {'worst err/allow':>16s} {'max|a-b|':>12s}  at")
    for point, (ratio, diff, where) in summary(rows).items():
        shown = "exact" if point in INDEX_POINTS and ratio == 0 else f"{ratio:.4f}"
        out(f"  {point:16s} {shown:>16s} {diff:12.3e}  {where}")
    bad = [r for r in rows if not r[3]]
    if bad:
        c, layer, point, _, ratio, diff = bad[0]
        out(f"  first divergence: {c} L{layer}.{point} (err/allow {ratio:.3g}, "
            f"max|a-b| {diff:.3g})")
    return not bad


def cmd_run(args, out=print) -> int:
    from port.attn_v41 import AttnStackV41 as Port
    from reference.attn_v41 import AttnStackV41 as Ref
    torch.set_num_threads(1)       # tiny tensors: a second thread only adds contention
    t0 = time.perf_counter()
    stem = args.fixture or DEFAULT_STEM
    man, rec, w = load_fixture(stem)
    off = man["official"]
    out(f"needle-parity ladder, model attn_v41: fixture {os.path.basename(stem)} of "
        f"{off.get('repo')} @ {off.get('revision', '')[:12]} (model.py sha256 "
        f"{off.get('sha256', '')[:16]}..., {off.get('used')})")
    ma = man["model_args"]
    out(f"model: {V41Args.from_any(ma).n_layers} layers, ratios {ma['compress_ratios']}, kv sources "
        f"{ma['kv_source_layers']}, index sources {ma['index_source_layers']}, candidate source "
        f"{ma['candidate_source_layer']}; {len(man['calls'])} calls "
        f"({', '.join(s['name'] for s in man.get('scenarios', []))})")
    order = [c["key"] for c in man["calls"]]
    port = Port(ma, w, backend=args.backend, decode="eager", device=args.device)   # checks
    ref = run_side(Ref(ma, w), man, rec)
    ok = _table("reference vs official", compare(ref, rec, "v41_official", order), out)
    eager_run = run_side(port, man, rec)
    ok &= _table(f"port ({args.backend}, eager, {args.device}) vs reference",
                 compare(eager_run, ref, "v41_port", order), out)
    # the graph check runs whatever --decode says (the eager side is the run just compared)
    graph = Port(ma, w, backend=args.backend, decode="graph", device=args.device)
    n, bad = graph_vs_eager(None, graph, man, rec, eager_run)
    how = (f"CUDA: {graph.graphs.captures} graphs captured and replayed"
           if graph.dev.type == "cuda" else
           "no CUDA: capturable body run eagerly on static buffers; capture+replay is "
           "tests/test_attn_v41_cuda.py")
    out(f"decode graph vs eager: {n - len(bad)}/{n} capturable layer-steps byte-identical "
        f"({how})" + (f"; first mismatch {bad[0]}" if bad else ""))
    ok &= not bad
    out(f"total {time.perf_counter() - t0:.2f} s; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads")
    return 0 if ok else 1
