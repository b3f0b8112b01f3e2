"""Device launches per decode token of the graph body, counted on the CPU (issue 12).

    python tools/bench/count_launches.py [--preset shipped] [--backends torch triton]
                                   [--weights dense cq] [--top 12] [--eager] [--threads 1]
                                   [--json OUT]

For each backend and weight form it builds the model at the preset's geometry (seeded random
weights, `init_params(cfg, 0, perturbed=True)`; "cq" through the .cact writer's quantiser with the
shipped bits map), runs position 0 eagerly, then runs `DecodeGraph.body` for one token under
`port.graph.record_body_ops` (the dispatch mode that also proves the body capturable) and counts:

  * every aten op the dispatcher sees while the body runs, except ops that launch no kernel:
    views (`OpOverload.is_view`: the schema returns an alias of an input) and `NO_KERNEL_OPS`
    (uninitialised allocations, `_unsafe_view`, aliasing helpers). Each remaining op counts
    as ONE launch. An aten op that runs several device kernels (e.g. `logsumexp` on CUDA:
    max, sub, exp, sum, log, add) still counts once, and a cuBLAS call counts once, so the
    aten part is a lower bound on what a GPU profiler would list;
  * every Triton launch `kernel[grid](...)`, once per launch whatever the grid. The launch is
    intercepted at `KernelInterface.__getitem__` (and the interpreter's override): it is
    recorded and NOT executed, so shipped-size kernels cost nothing under TRITON_INTERPRET=1.
    The kernel's outputs stay uninitialised; that cannot change the count because the body
    has no data-dependent control flow (record_body_ops refuses host syncs). The torch ops a
    launch wrapper issues around the kernel (padding, `.contiguous()`) are counted as aten ops.

The total is "launches per token": one CUDA-graph replay of the body issues exactly these
launches. The op sequence is position-independent (tests/port/test_graph.py), so one token suffices.

`--eager` also counts one eager `V2Model.step` (decode="eager", position 1) the same way: every
launching aten op plus every Triton launch, host synchronisations allowed. Tensors the eager step
makes from host lists are uploads on a GPU (one copy each) but are born on the CPU here, so the
eager count misses those copies. tools/bench/bench_gpu_decode.py reads both counts from `--json`.

Each weight form is built once (the cq quantisation is the slow part) and every backend is made
over the same parts with `V2Model.new`. The uncounted prefill at position 0 drops its Triton
launches too (see `_prefill`), so the shipped geometry counts in well under a minute.

`--by-function` also attributes every counted launch to the innermost of the model functions in
`ATTRIBUTED` that was running when it was issued (the rest to "other"): the launches a fused
kernel would replace are those of the functions it subsumes (e.g. `log_sinkhorn` for the mHC
routing kernel, `mlp` plus one `zc` per layer for the Hadamard MLP kernel).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import json
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
os.environ.setdefault("TRITON_INTERPRET", "1")                    # before any triton.jit runs
import port.model as model_mod                                   # noqa: E402
from port.graph import (BodyRecorder, DecodeGraph, record_body_ops,  # noqa: E402
                        triton_launch_log)
from port.model import V2Model                                   # noqa: E402
from reference.config import V2Config                            # noqa: E402
from reference.params import init_params                         # noqa: E402

# Ops that allocate without writing or only relabel memory: no device kernel.
NO_KERNEL_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
    "_unsafe_view", "alias", "detach", "lift_fresh", "_reshape_alias", "set_",
})
ISSUE_BASELINE = 5344             # issue 12: triton graph body, shipped, before any fusion


def _overload(qualified: str):
    """'aten.mul.Tensor' -> torch.ops.aten.mul.Tensor (None if it does not resolve)."""
    ns, name, overload = (qualified.split(".") + ["default"])[:3]
    try:
        return getattr(getattr(getattr(torch.ops, ns), name), overload)
    except AttributeError:
        return None


def launches_op(qualified: str) -> bool:
    """Does this recorded aten op launch a device kernel (see the module docstring)?"""
    name = qualified.split(".")[1] if "." in qualified else qualified
    if name in NO_KERNEL_OPS:
        return False
    op = _overload(qualified)
    return not (op is not None and getattr(op, "is_view", False))


class _KernelNames(list):
    """A launch log (port.graph.triton_launch_log's entries) that keeps only kernel names."""

    def append(self, entry):
        super().append(entry[0][len("triton:"):])


@contextlib.contextmanager
def triton_launches():
    """Record every Triton launch (kernel name) instead of running it; yields the list."""
    with triton_launch_log(_KernelNames(), run=False) as names:
        yield names


def _prefill(model: V2Model, state, skip_triton: bool) -> None:
    """Position 0 (a prefill: eager, not counted). With skip_triton its Triton launches are
    recorded and dropped, as in the counted step: under the interpreter a shipped-size kernel
    takes seconds to minutes, and no count depends on the values it would have written (the
    counted code has no data-dependent control flow)."""
    if skip_triton:
        with triton_launches():
            model.step(3, state)
    else:
        model.step(3, state)


def count_body(model: V2Model, token: int = 17, skip_triton_prefill: bool = False
               ) -> collections.Counter:
    """Launches of one graph-body token, by op (aten name, or 'triton:<kernel>')."""
    state = model.make_state()
    _prefill(model, state, skip_triton_prefill)
    graph = DecodeGraph(model, state)
    with triton_launches() as kernels:
        ops = record_body_ops(graph, token)
    # record_body_ops logs the launches too (as "triton:<kernel>" entries): counted once, here
    counts = collections.Counter(op for op, *_ in ops
                                 if not op.startswith("triton:") and launches_op(op))
    counts.update(f"triton:{k}" for k in kernels)
    return counts


class _AnyOpRecorder(TorchDispatchMode):
    """Every aten op an eager step issues (host synchronisations are allowed there)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def count_eager(model: V2Model, token: int = 17, skip_triton_prefill: bool = False
                ) -> collections.Counter:
    """Launches of one eager `model.step` at position 1 (model built with decode="eager"), by op.
    Triton launches are recorded and not run, as in count_body."""
    state = model.make_state()
    _prefill(model, state, skip_triton_prefill)
    with triton_launches() as kernels, _AnyOpRecorder() as rec:
        model.step(token, state)
    counts = collections.Counter(op for op in rec.ops if launches_op(op))
    counts.update(f"triton:{k}" for k in kernels)
    return counts


def count_configs(cfg, params, backends, weights, eager: bool = False):
    """{"backend:weights": (graph-body Counter, eager Counter or None, graph model)}, each
    weight form built once and shared by every backend (V2Model.new over its parts)."""
    out = {}
    for w in weights:
        base = V2Model.from_params(params, cfg, weights=w)
        for b in backends:
            model = V2Model.new(cfg, *base.parts, backend=b, decode="graph")
            eager_counts = None
            if eager:
                eager_counts = count_eager(V2Model.new(cfg, *base.parts, backend=b,
                                                       decode="eager"), skip_triton_prefill=True)
            out[f"{b}:{w}"] = (count_body(model, skip_triton_prefill=True), eager_counts, model)
    return out


# (owner, attribute) of the functions --by-function attributes launches to.
ATTRIBUTED = [(model_mod, "log_sinkhorn"), (model_mod, "zc"), (model_mod, "unit_rms"),
              (model_mod, "sigmoid"), (model_mod, "silu"), (V2Model, "mm"),
              (V2Model, "mlp"), (V2Model, "rope"), (V2Model, "finish")]


@contextlib.contextmanager
def attributing():
    """Wrap the ATTRIBUTED functions so each op can be charged to the innermost one running.
    Yields the stack of their names (empty outside all of them)."""
    stack, saved = [], [(o, n, o.__dict__[n]) for o, n in ATTRIBUTED]

    def wrap(name, fn):
        def run(*a, **k):
            stack.append(name)
            try:
                return fn(*a, **k)
            finally:
                stack.pop()
        return run
    for owner, name, fn in saved:
        setattr(owner, name, wrap(name, fn))
    try:
        yield stack
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


class _ChargingRecorder(BodyRecorder):
    def __init__(self, stack):
        super().__init__()
        self.stack, self.charged = stack, collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if launches_op(str(func)):
            self.charged[self.stack[-1] if self.stack else "other"] += 1
        return super().__torch_dispatch__(func, types, args, kwargs)


def count_by_function(model: V2Model, token: int = 17) -> collections.Counter:
    """Launches of one graph-body token charged to the innermost ATTRIBUTED function."""
    state = model.make_state()
    model.step(3, state)
    graph = DecodeGraph(model, state)
    with triton_launches() as kernels, attributing() as stack:
        graph.prep(token)
        with _ChargingRecorder(stack) as rec:
            graph.body()
    rec.charged["other"] += len(kernels)       # the Triton launches: sparse_attn today
    return rec.charged


def build(cfg, params, backend: str, weights: str) -> V2Model:
    return V2Model.from_params(params, cfg, weights=weights, backend=backend, decode="graph")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="shipped")
    ap.add_argument("--backends", nargs="+", default=["torch", "triton"],
                    choices=["torch", "triton"])
    ap.add_argument("--weights", nargs="+", default=["dense", "cq"], choices=["dense", "cq"])
    ap.add_argument("--top", type=int, default=12, help="ops listed per configuration")
    ap.add_argument("--by-function", action="store_true",
                    help="also charge launches to model functions (see the docstring)")
    ap.add_argument("--eager", action="store_true",
                    help="also count one eager step per configuration (see the docstring)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (counts do not depend on it; see main)")
    ap.add_argument("--json", help="also write the counts here")
    a = ap.parse_args(argv)
    try:
        cfg = V2Config.preset(a.preset)
    except (KeyError, ValueError) as e:
        print(f"count_launches: unknown preset {a.preset!r} ({e})", file=sys.stderr)
        return 2
    if a.threads < 1:
        print(f"count_launches: --threads {a.threads} must be >= 1", file=sys.stderr)
        return 2
    if "triton" in a.backends and importlib.util.find_spec("triton") is None:
        # the default install has no Triton (it is the 'gpu' extra); say so, not a traceback
        print("count_launches: --backends triton needs Triton, which is not installed: "
              "pip install -e '.[gpu]' (or count --backends torch alone)", file=sys.stderr)
        return 2
    # One thread by default: the count is the same, and on a busy machine the cq quantiser's
    # parallel regions spin (shipped cq build, loaded 2-core machine: 115 s on 2 threads, 11 s
    # on 1).
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    params = init_params(cfg, 0, perturbed=True)
    report = {"preset": a.preset, "layers": cfg.num_layers, "configs": {}}
    print(f"device launches per decode token, graph body, preset {a.preset} "
          f"({cfg.num_layers} layers); issue-12 baseline {ISSUE_BASELINE}")
    counted = count_configs(cfg, params, a.backends, a.weights, eager=a.eager)
    for key, (counts, eager_counts, model) in counted.items():
        total = sum(counts.values())
        triton_n = sum(v for k, v in counts.items() if k.startswith("triton:"))
        entry = report["configs"][key] = {"total": total, "triton": triton_n,
                                          "by_op": dict(counts.most_common())}
        print(f"\n{key}: {total} launches per token "
              f"({total / cfg.num_layers:.0f} per layer; {triton_n} Triton)")
        for op, n in counts.most_common(a.top):
            print(f"  {n:6d}  {op}")
        if eager_counts is not None:
            entry["eager_total"] = sum(eager_counts.values())
            entry["eager_by_op"] = dict(eager_counts.most_common())
            print(f"  eager step: {entry['eager_total']} launches")
        if a.by_function:
            charged = count_by_function(model)
            assert sum(charged.values()) == total, (charged, total)
            entry["by_function"] = dict(charged)
            print("  charged to the innermost model function:")
            for fn, n in charged.most_common():
                print(f"  {n:6d}  {fn}")
    if a.json:                          # temp file, then rename: never a half-written JSON
        with open(a.json + ".tmp", "w") as f:
            json.dump(report, f, indent=1)
        os.replace(a.json + ".tmp", a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
