"""The backend seam: what runs each thing a step does, chosen once when the model is built.

    backend = make_backend(model, "torch" | "triton" | "native", decode="eager" | "graph")

One object per model (`V2Model.impl`), one method per thing a step does:

    rows(tokens, state, pos0, ...)     positions the host feeds as rows: a prefill chunk, or an
                                       eager one-token step (the torch ops of V2Model.forward_rows,
                                       or the C step)
    decode_prep(graph, token)          host half of a one-token decode step (port/graph.py)
    decode_body(graph, trace)          device half: V2Model's layer op by op (torch), the fused
                                       kernels (triton, port/fused.py)
    step_layer(i, lanes, state, ...)   one layer alone, for injection (ladder locate)
    attend(q, k_rows, v_rows, sel, s)  the attention kernel the eager rows call

and the facts the rest of the project asks about instead of testing the backend's name:
`uses_body(state)`, `runs_body`, `traces_body`, `hidden_points`, `graph_capture`,
`graph_replay`, `traces_batch`,
`capture_table`, `contiguous_logits`, `threads()`.

Graph capture is not a fourth body: `decode="graph"` makes a torch (or triton) model run its
decode steps as prep + body, and on CUDA replay that body from one captured CUDA graph
(`graph_replay`). The backend matrix is in docs/design.md ("The backend seam").

This is the only module that tests a backend's or decode mode's name (`make_backend`).
"""
from __future__ import annotations

import torch

from . import attn
from .errors import StepError
from .graph import body_state_ok
from .parts import PartError

DECODES = ("eager", "graph")


class TorchBackend:
    """Eager torch: every op is V2Model's own. decode="graph": decode steps run as prep + the
    torch body (port/graph.py DecodeGraph.torch_body), replayed from a CUDA graph on CUDA."""
    name = "torch"
    fuses = False                   # decode steps in fused kernels (port/fused.py)
    needs_triton = False            # the backend launches Triton kernels
    native = False                  # the C step: computes on dense rows or packed codes
    reads_codes = False             # a cq model keeps its codes packed (the native backend)
    traces_body = False             # step_traced runs the decode body (else the eager rows)
    traces_batch = True             # a traced prefill_batch sees every chunk row
    contiguous_logits = False       # the step writes a contiguous [vocab] buffer only
    capture_table = None            # the C step's capture points (checked by the ladder)
    hidden_points: dict = {}        # points a decode step cannot show -> the kernel holding them
    state_dtype = None              # a 16-bit ring and lanes (V2State act_dtype), or float32

    @classmethod
    def runs_torch_body(cls, decode: str) -> bool:
        """Do this backend's decode steps run DecodeGraph.torch_body under `decode`?"""
        return decode == "graph"

    @classmethod
    def runs_precision(cls, prec, decode: str) -> bool:
        """Can this backend compute at `prec` (port/precision.py PortPrecision) under `decode`?
        The eager torch ops round at every store, any precision; the graph body is float32."""
        return prec.is_float32 or decode == "eager"

    def __init__(self, model, decode: str = "eager"):
        self.model, self.decode = model, decode
        self.graph_capture = decode == "graph"  # a plain decode body is a graph replay (CUDA)
        self.runs_body = self.graph_capture     # decode steps as prep + a capturable body
        if model.form == "packed":
            raise PartError("packed codes run on backend='native' only; the torch and triton "
                            "backends compute on dense or rotated matrices")

    # ---- which path runs a step ----
    def uses_body(self, state) -> bool:
        """Does `step` run the decode body (prep + device body) on this state? Bodies run on
        a windowed ring without pad keys; position 0 and everything else run `rows`."""
        return self.runs_body and body_state_ok(state)

    @property
    def graph_replay(self) -> bool:
        """A plain decode body step replays one captured CUDA graph (decode="graph" on CUDA)."""
        return self.graph_capture and self.model.device.type == "cuda"

    def threads(self) -> tuple:
        """(thread count, who): the threads that compute the products."""
        return torch.get_num_threads(), "torch"

    # ---- the step's parts ----
    def rows(self, tokens: list, state, pos0: int, keep: list, *, logits, trace, want_logits,
             pool):
        return self.model.forward_rows(tokens, state, pos0, keep, logits=logits, trace=trace,
                                       want_logits=want_logits, pool=pool)

    def decode_prep(self, graph, token: int) -> None:
        graph.prep(token)

    def decode_body(self, graph, trace=None):
        return graph.torch_body(trace=trace)

    def attend(self, q, k_rows, v_rows, sel, scale):
        return attn.sparse_attn_torch(q, k_rows, v_rows, sel, scale, block=attn.TORCH_TILE)

    def step_layer(self, i: int, lanes, state, pos: int, engram, trace, prefill: bool):
        """Layer i alone at `pos` on `lanes` [n, d]: the decode body's layer where a decode
        step at `pos` runs the body (not prefill), else V2Model.layer."""
        model, cfg = self.model, self.model.cfg
        if engram is None:
            engram = model.engram(state.clone(), pos, 1)
        f32 = dict(device=state.k.device, dtype=torch.float32)   # the eager ops' dtype
        eng = [(k.reshape(1, -1).to(**f32), v.reshape(1, -1).to(**f32)) for k, v in engram]
        X = lanes.reshape(1, cfg.mhc_lanes, cfg.d_model).to(**f32)
        if pos and not prefill and self.uses_body(state):
            rt = state.attn_runtime(model)        # as the decode body runs a layer
            rt.invalidate_decode_uploads()
            rt.decode_prep(i, pos)
            return self.body_layer(i, X, eng, state, rt, trace)
        cos, sin = model.cos[pos:pos + 1, None, :], model.sin[pos:pos + 1, None, :]
        return model.layer(i, X, eng, state, pos, cos, sin, trace=trace)[0]

    def body_layer(self, i: int, X, eng, state, rt, trace):
        """One layer as DecodeGraph.torch_body runs it (positions from the runtime's buffers)."""
        model = self.model
        cos = model.cos.index_select(0, rt.pos)[:, None, :]
        sin = model.sin.index_select(0, rt.pos)[:, None, :]
        return model.layer(i, X, eng, state, 0, cos, sin, trace=trace,
                           attention=rt.decode_body)[0]


class TritonBackend(TorchBackend):
    """Decode steps in fused Triton kernels (port/fused.py, `model.fused`); prefill rows are
    V2Model's ops with Triton attention."""
    name = "triton"
    fuses = needs_triton = True
    traces_body = True

    @classmethod
    def runs_torch_body(cls, decode: str) -> bool:
        return False

    @classmethod
    def runs_precision(cls, prec, decode: str) -> bool:
        # The fused body (eager or graph) holds its ring in the activation dtype: no int8 cache.
        return prec.is_float32 or prec.kv == prec.activations

    def __init__(self, model, decode: str = "eager"):
        super().__init__(model, decode)
        self.runs_body = True
        from .fused import FusedBody
        model.fused = FusedBody(model)
        act = model.fused.act
        self.state_dtype = None if act == torch.float32 else act

    @property
    def hidden_points(self) -> dict:
        from .fused import HIDDEN
        return dict(HIDDEN)

    def decode_body(self, graph, trace=None):
        return self.model.fused(graph, graph.state, trace=trace)

    def attend(self, q, k_rows, v_rows, sel, scale):
        return attn.sparse_attn_triton(q, k_rows, v_rows, sel, scale)

    def body_layer(self, i: int, X, eng, state, rt, trace):
        """One fused layer on lanes and Engram rows in the body's activation dtype; the new
        lanes come back float32 (exact), as the eager layer's do."""
        fb = self.model.fused
        act = fb.act
        out = fb.layer(i, X[0].to(act), [(k[0].to(act), v[0].to(act)) for k, v in eng], state,
                       rt, trace=fb.widened(trace))
        return out.float()


class NativeBackend:
    """The C step (kernels/native/, port/native.py): m positions in one call, eager, CPU."""
    name = "native"
    fuses = needs_triton = False
    native = True
    reads_codes = True
    runs_body = False
    state_dtype = None              # float32 throughout
    traces_body = False
    traces_batch = False            # the C step captures a call's first row only
    contiguous_logits = True
    hidden_points: dict = {}
    graph_capture = graph_replay = False

    @classmethod
    def runs_precision(cls, prec, decode: str) -> bool:
        return prec.is_float32                  # the C step computes in float32

    def __init__(self, model, decode: str = "eager"):
        if not self.runs_on(model.device.type, decode):
            raise ValueError(f"backend='native' runs eagerly on the CPU (device="
                             f"{model.device}, decode={decode!r})")
        self.model, self.decode = model, decode
        from kernels import native
        from .native import NativeModel
        self.capture_table = native.CAPTURES
        model._native = NativeModel(model)

    @classmethod
    def runs_torch_body(cls, decode: str) -> bool:
        return False

    @classmethod
    def runs_on(cls, device_type: str, decode: str) -> bool:
        """Can this backend run on a `device_type` device with `decode`? (CPU, eager.)"""
        return device_type == "cpu" and decode == "eager"

    def uses_body(self, state) -> bool:
        return False

    def threads(self) -> tuple:
        import ctypes
        from kernels.native import lib
        return ctypes.c_int.in_dll(lib(), "nat_threads").value, "C"

    def rows(self, tokens: list, state, pos0: int, keep: list, *, logits, trace, want_logits,
             pool):
        from .native import run_rows
        model = self.model
        return run_rows(model, model._native, tokens, state, pos0, logits, trace, want_logits,
                        pool)

    def decode_prep(self, graph, token: int) -> None:
        raise StepError("backend='native' has no decode body: its steps run eagerly")

    def decode_body(self, graph, trace=None):
        raise StepError("backend='native' has no decode body: its steps run eagerly")

    def step_layer(self, i: int, lanes, state, pos: int, engram, trace, prefill: bool):
        from .native import run_layer
        return run_layer(self.model, self.model._native, i, lanes, state, pos, engram, trace)


BACKEND_CLASSES = {"torch": TorchBackend, "triton": TritonBackend, "native": NativeBackend}
BACKENDS = tuple(BACKEND_CLASSES)


def backend_class(backend: str):
    """The class of a backend name (ValueError naming the known ones)."""
    if backend not in BACKEND_CLASSES:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    return BACKEND_CLASSES[backend]


def check_names(backend: str, decode: str):
    backend_class(backend)
    if decode not in DECODES:
        raise ValueError(f"decode={decode!r} is not one of {DECODES}")


def check_precision(prec, backend: str, decode: str) -> None:
    """PrecisionError unless `backend` computes at `prec` under `decode` (ladder/cli/args.py
    restates the rule without torch; tests/port/test_fused_precision.py holds the two equal)."""
    from .precision import PrecisionError
    check_names(backend, decode)
    if not BACKEND_CLASSES[backend].runs_precision(prec, decode):
        raise PrecisionError(
            f"precision {prec.activations} (kv {prec.kv}) runs on backend torch, decode eager, "
            f"or on backend triton with the KV cache in the activation dtype; given backend "
            f"{backend}, decode {decode}")


def make_backend(model, backend: str = "torch", decode: str = "eager"):
    """The backend object of `model` (its parts, form and device already set)."""
    check_names(backend, decode)
    return BACKEND_CLASSES[backend](model, decode)
