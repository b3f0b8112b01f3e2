"""The decode step as host prep + a device body that one CUDA graph can replay at any position.

Prep (host): validate the token, then write everything that depends on the token or the
position into static buffers — token id, RoPE row, ring slot, Engram table rows and validity,
tap slots and validity, the `window`-wide selection — uploading only what changed. Body
(device): the whole step, reading per-token values only from those buffers: no `.item()`, no
shape or Python branch that depends on the position. So the op sequence is the same at every
position (`record_body_ops` proves it on CPU) and a graph captured once replays for any token;
the body's arithmetic is the eager step's, so its bits equal `V2Model.step`'s.
"""
from __future__ import annotations

import contextlib
import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .attn import WINDOW_CLASS
from .errors import StepError
from .host import host_row

# Ops that read a device value on the host or size their output by data: not capturable.
HOST_SYNC_OPS = ("_local_scalar_dense", "item", "nonzero", "masked_select", "unique",
                 "_unique2", "bincount", "repeat_interleave")


class HostSyncError(RuntimeError):
    """The body did something a CUDA graph cannot replay (names the op)."""


def body_state_ok(state) -> bool:
    """Can a decode body run on this state? A windowed ring without pad keys."""
    return bool(state.window) and not state.pad_aware


class DecodeGraph:
    """Static buffers, prep and body for one (model, state) pair. Ring states only."""

    def __init__(self, model, state):
        cfg = model.cfg
        if not body_state_ok(state):
            raise StepError("the graph path needs a windowed ring state without pad keys "
                            f"(window={state.window}, pad_aware={state.pad_aware})")
        self.model, self.state, dev = model, state, model.device
        T, taps = cfg.engram_tables, cfg.engram_taps
        i64 = dict(dtype=torch.int64, device=dev)
        self.token = torch.zeros(1, **i64)
        self.eslot = torch.zeros(1, **i64)                # pos % Engram ring
        self.rows = torch.zeros(T, **i64)                 # flat Engram table rows
        self.ngram_ok = torch.zeros(T, device=dev)
        self.tap_slots = torch.zeros(taps, **i64)
        self.tap_ok = torch.zeros(taps, device=dev)
        self.window = state.window
        self._host = {}                                   # what each buffer holds now
        self.graph = None

    # ---- host ----
    def prep(self, token: int) -> None:
        model, state, cfg = self.model, self.state, self.model.cfg
        token = model.check_step(token, state)
        pos, R, dil = state.pos, state.engram_ring, cfg.engram_dilation
        if pos == 0:
            raise StepError("position 0 is a prefill: run it eagerly (DecodeGraph.step does)")
        rt = state.attn_runtime(model)
        rt.decode_prep(WINDOW_CLASS, pos)       # position, ring slot, selection (or refuses)
        state.tokens.append(token)
        state.valid.append(True)
        flat, ok, taps = host_row(cfg, state.tokens, None, pos)     # no pad keys here
        values = {
            "token": [token], "eslot": [pos % R], "rows": flat, "ngram_ok": ok,
            "tap_slots": [(pos - j * dil) % R for j in range(cfg.engram_taps)],
            "tap_ok": [1.0 if t else 0.0 for t in taps],
        }
        for name, vals in values.items():
            if self._host.get(name) != vals:              # upload only what changed
                buf = getattr(self, name)
                buf.copy_(torch.tensor(vals, dtype=buf.dtype), non_blocking=True)
                self._host[name] = vals

    # ---- device ----
    def body(self, trace=None) -> torch.Tensor:
        """The device half, as the model's backend runs it (`impl.decode_body`): the fused
        kernels on the triton backend (port/fused.py), else `torch_body`. `trace` sees every
        point a kernel boundary exposes (fused body), or every point V2Model.layer's does."""
        return self.model.impl.decode_body(self, trace=trace)

    def torch_body(self, trace=None) -> torch.Tensor:
        """The torch backend's device half: the ops of V2Model.layer with the runtime's
        attention, every per-token value read from the static buffers."""
        model, state, cfg = self.model, self.state, self.model.cfg
        n, d = cfg.mhc_lanes, cfg.d_model
        x0 = model.embedding.table.index_select(0, self.token) * math.sqrt(d)   # [1, d]
        if trace:
            trace("embed", None, x0[0])
        eng = []
        for s, site in enumerate(model.engrams):
            e = (site.tables.index_select(0, self.rows)[None] * self.ngram_ok[None, :, None])
            kv = model.mm(e.reshape(1, -1), site.kv)
            k, vraw = kv[:, :d], kv[:, d:]
            state.vraw[s].index_copy_(0, self.eslot, vraw)
            acc = torch.zeros_like(vraw[0])
            for j in range(cfg.engram_taps):
                acc = acc + site.taps[j] * state.vraw[s].index_select(0, self.tap_slots[j:j + 1])[0] \
                    * self.tap_ok[j]
            eng.append((k, acc[None]))
            if trace:
                trace(f"engram_k{s}", None, k[0])
                trace(f"engram_v{s}", None, acc)
        X = x0[:, None, :].expand(1, n, d)
        rt = state.attn_runtime(model)
        cos = model.cos.index_select(0, rt.pos)[:, None, :]
        sin = model.sin.index_select(0, rt.pos)[:, None, :]
        for i in range(cfg.num_layers):
            X = model.layer(i, X, eng, state, 0, cos, sin, attention=rt.decode_body,
                            trace=trace)
        return model.finish(X, state, trace=trace)

    # ---- the step ----
    def step(self, token: int, trace=None) -> torch.Tensor:
        """prep, then the body: replayed from a CUDA graph for decode="graph" on CUDA, launched
        eagerly otherwise (and when traced). Position 0 is a prefill and runs eagerly."""
        if self.state.pos == 0:
            return self.model.run_step(token, self.state, trace=trace)
        self.model.impl.decode_prep(self, token)
        if trace is not None or not self.model.impl.graph_replay:
            return self.body(trace=trace)
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.state.logits

    def _capture(self):
        self.graph, _ = capture_without_advancing(self.state, self.body, cuda_capture)


def cuda_capture(body):
    """(CUDAGraph, body's outputs): `body` warmed up on a side stream (allocator, kernels),
    then captured once. Shared by both models' graphs (port/v41/graph.py too)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = body()
    return graph, outs


def capture_without_advancing(state, body, capture):
    """capture(body) -> what it returns, with every tensor of `state` put back afterwards: warm-up and
    capture both run the body (each writes the ring, lanes, logits), yet the step being
    captured must advance the state once, when the graph is replayed. Device-free, so the
    restore is tested on CPU with a stand-in for `capture`."""
    saved = {name: t.clone() for name, t in state.__dict__.items()
             if isinstance(t, torch.Tensor)}
    graph = capture(body)
    for name, t in saved.items():
        getattr(state, name).copy_(t)
    return graph


def _describe(a):
    """An op argument as the capture sees it: tensors by shape and dtype, the rest by value."""
    if isinstance(a, torch.Tensor):
        return ("T", tuple(a.shape), str(a.dtype))
    if isinstance(a, (list, tuple)):
        return tuple(_describe(x) for x in a)
    return repr(a)


class BodyRecorder(TorchDispatchMode):
    """Records every op a capturable body issues (with argument shapes and values) and refuses
    host synchronisations; `what` names the body in the error. Shared by port/v41/graph."""

    def __init__(self, what: str = "decode body"):
        super().__init__()
        self.ops, self.what = [], what

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in HOST_SYNC_OPS:
            raise HostSyncError(f"{self.what} calls {func} (a host synchronisation or a "
                                f"data-dependent shape): not capturable")
        kw = _describe(tuple(sorted((kwargs or {}).items())))
        self.ops.append((str(func), _describe(args), kw))
        return func(*args, **(kwargs or {}))


def launch_classes():
    """The classes whose `kernel[grid]` starts a Triton launch (compiled, and interpreted)."""
    try:
        import triton.runtime.jit as jit
    except ImportError:                                   # pragma: no cover
        return []
    classes = [jit.KernelInterface]
    try:
        from triton.runtime.interpreter import InterpretedFunction
        classes.append(InterpretedFunction)
    except ImportError:                                   # pragma: no cover
        pass
    return classes


@contextlib.contextmanager
def triton_launch_log(log: list, run: bool = True, describe: bool = True):
    """Append ("triton:<kernel>", grid, described args, described kwargs) to `log` for every
    Triton launch `kernel[grid](...)` while active (describe=False: the kernel object, grid,
    args and kwargs themselves); the launch runs unless run=False (then its outputs stay
    unwritten: a count, not a computation). Undone on exit."""
    classes = launch_classes()
    saved = {c: (c.__dict__.get("__getitem__"), c.__getitem__) for c in classes}

    def patch(orig):
        def getitem(self, grid):
            fn = getattr(self, "fn", self)
            name = f"triton:{getattr(fn, '__name__', repr(fn))}"

            def launch(*args, **kwargs):
                log.append((name, _describe(grid), _describe(args),
                            _describe(tuple(sorted(kwargs.items())))) if describe else
                           (self, grid, args, kwargs))
                if run:
                    return orig(self, grid)(*args, **kwargs)
            return launch
        return getitem
    for c, (_, resolved) in saved.items():
        c.__getitem__ = patch(resolved)
    try:
        yield log
    finally:
        for c, (own, _) in saved.items():
            if own is None:
                del c.__getitem__
            else:
                c.__getitem__ = own


def record_body_ops(graph: DecodeGraph, token: int) -> list:
    """prep(token) on the host, then the body under a dispatch mode that refuses host syncs and
    records every op with its argument shapes and non-tensor values, Triton launches included
    (kernel, grid, argument shapes and scalar values). Identical lists at two positions mean
    one capture is valid for both."""
    graph.prep(token)
    with BodyRecorder() as rec, triton_launch_log(rec.ops):
        graph.body()
    return rec.ops
