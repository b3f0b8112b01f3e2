"""Planted faults: known bugs switched into the port from the ladder side, for tests and the
`python -m ladder run --plant FAULT` demo.

Every backend the project ships gets the fault in its own code:
- torch, eager or decode="graph" (the graph body runs the same `layer`): a context
  manager monkeypatches port internals (module globals, V2Model and AttnRuntime methods)
  and restores them on exit; nothing under port/ is edited. Where a bug lives inside the body
  of `V2Model.layer` or `attention`, the fault recompiles that method from its own source
  with one line changed (a mutation): if the port's source moves on, the fault refuses with
  the text it looked for, instead of silently planting nothing.
- triton: decode steps run the fused body (port/fused.py), so each fault also has a fused
  form (`Fault.fused`) that patches the shared kernel sets (`port.fused.KERNELS`) or a
  FusedBody method the same way: the kernel handed the wrong operand, the same bug. Prefill
  positions run V2Model's layer and get the torch patch, so both are planted together.
- native: the same bug as a compile-time switch of the C step (`-DNEEDLE_FAULT_...` in
  kernels/native/needle_step.c), built into its own cached library and swapped in by
  `kernels.native.planted_build`. Host-side faults (the n-gram hash is computed in Python for
  both) plant the same patch. A fault with no counterpart in a backend says why
  (`Fault.not_in(backend)`), and planting it there raises FaultError.

Every fault declares the capture point it touches first and the first position where it can
show. tests/ladder/sides/test_faults.py checks the declaration bit for bit (clean port vs faulty
port: the first point that differs at all) and then that `locate` (faulty port vs the
reference, under the tolerance rules) names exactly that point.
"""
from __future__ import annotations

import contextlib
import inspect
import textwrap
from dataclasses import dataclass
from typing import Callable

import port.model as pm
from port.backend import backend_class
from port.model import BACKENDS, V2Model


class FaultError(RuntimeError):
    """A fault that cannot be planted in this port (names the fault and what it needs)."""


HOST = "host"      # Fault.native: the torch-side patch applies to the native backend as is


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    plant: Callable          # (**kw) -> context manager
    touches: Callable        # cfg -> (point, earliest absolute position it can show at)
    exact: bool = True       # it shows at exactly that position (False: data may hide it
                             # there, as a converged Sinkhorn hides one missing iteration)
    weights: str = "dense"   # the port weight form the fault lives in
    at_load: bool = False    # acts while the model is built: plant it before from_params
    requires: Callable = lambda: ""     # () -> what this port lacks for it ("" if nothing)
    native: str = ""         # the C step's switch (NEEDLE_FAULT_...), or HOST: the patch above
                             # acts on host code the native backend runs too
    not_native: str = ""     # why the C step has no counterpart (when `native` is empty)
    fused: Callable = None   # (**kw) -> context manager: the fault in the fused decode body
                             # (None: it acts outside the body, on host code or at load)

    def not_in(self, backend: str) -> str:
        """Why this fault cannot be planted in `backend` ("" when it can)."""
        if backend not in BACKENDS:
            return f"unknown backend {backend!r} (known: {BACKENDS})"
        if backend_class(backend).native and not self.native:
            return self.not_native or "it has no counterpart in the C step"
        return ""

    def plant_in(self, backend: str = "torch", **kw):
        """The context manager that plants this fault in `backend`'s implementation."""
        if self.not_in(backend):
            raise FaultError(f"fault {self.name} cannot be planted: not in backend {backend}: "
                             f"{self.not_in(backend)}")
        if self.needs:
            raise FaultError(f"fault {self.name} cannot be planted: {self.needs}")
        cls = backend_class(backend)
        if cls.native and self.native != HOST:
            if kw:
                raise FaultError(f"fault {self.name}: the C switch {self.native} is fixed at "
                                 f"build time; parameters {sorted(kw)} apply to torch only")
            from kernels import native
            return native.planted_build(self.native)
        if cls.fuses and self.fused is not None:
            return _both(self.plant(**kw), self.fused(**kw))
        return self.plant(**kw)

    @property
    def needs(self) -> str:
        return self.requires()

    @property
    def available(self) -> bool:
        return not self.needs


@contextlib.contextmanager
def patched(obj, attr, value):
    old = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        setattr(obj, attr, old)


@contextlib.contextmanager
def _both(a, b):
    with a, b:
        yield


@contextlib.contextmanager
def _fused_kernel(name: str, wrap):
    """Every fused kernel set's `name` replaced by wrap(original) while planted."""
    from port.fused import KERNELS
    with contextlib.ExitStack() as stack:
        for ns in KERNELS.values():
            stack.enter_context(patched(ns, name, wrap(getattr(ns, name))))
        yield


def _fused_layer(layer: int, around):
    """FusedBody.layer with `around(body, i)` (a context manager) held while layer `layer`
    runs."""
    from port.fused import FusedBody
    orig = FusedBody.layer

    def run(self, i, *args, **kw):
        if i != layer:
            return orig(self, i, *args, **kw)
        with around(self):
            return orig(self, i, *args, **kw)
    return patched(FusedBody, "layer", run)


def _mutated_layer(fault: str, old: str, new: str, method: str = "layer"):
    """V2Model.<method> recompiled with `old` replaced by `new` (exactly one occurrence)."""
    src = textwrap.dedent(inspect.getsource(getattr(V2Model, method)))
    if src.count(old) != 1:
        raise FaultError(f"fault {fault}: expected exactly one {old!r} in V2Model.{method}, "
                         f"found {src.count(old)}; the port changed, update the fault")
    code = compile(src.replace(old, new), f"<fault {fault}: port/model.py V2Model.{method}>",
                   "exec")
    ns: dict = {}
    exec(code, pm.__dict__, ns)            # the port's own globals: later patches still apply
    return ns[method]


def sinkhorn_iters(iters: int = 19):
    orig = pm.log_sinkhorn
    return patched(pm, "log_sinkhorn", lambda z, _iters=20: orig(z, iters))


def rope_shift(layer: int = 3, shift: int = 1):
    """RoPE applied at pos+shift in one layer (q and k both)."""
    import torch
    orig = V2Model.layer

    def shifted(self, i, X, eng, state, pos0, cos, sin, *, trace=None, attention=None):
        if i == layer:
            L = self.cos.shape[0]
            if attention is None:
                idx = torch.tensor([(pos0 + r + shift) % L for r in range(X.shape[0])],
                                   device=self.device)
            else:           # the graph body: the position is in the runtime's device buffer
                idx = (state.attn_runtime(self).pos + shift) % L
            cos = self.cos.index_select(0, idx)[:, None, :]
            sin = self.sin.index_select(0, idx)[:, None, :]
        return orig(self, i, X, eng, state, pos0, cos, sin, trace=trace, attention=attention)
    return patched(V2Model, "layer", shifted)


def window_off_by_one(short: int = 1):
    """The oldest `short` keys of a full window left out of the attention's selection (what
    the kernel is handed), in the eager forward and the graph's decode_prep alike."""
    from port.attn import AttnRuntime
    orig = AttnRuntime.selection

    def selection(self, pos):
        sel = orig(self, pos)
        if self.state.window > short:
            sel = sel.clone()
            sel[:short] = -1
        return sel
    return patched(AttnRuntime, "selection", selection)


def fused_sinkhorn_iters(iters: int = 19):
    return _fused_kernel("mhc_route", lambda f: lambda *a, **k: f(*a, **{**k, "iters": iters}))


def fused_rope_shift(layer: int = 3, shift: int = 1):
    """The layer's q/k prelude handed the RoPE tables advanced by `shift` rows (pos+shift,
    wrapping at max_seq_len as the torch fault does)."""
    @contextlib.contextmanager
    def around(body):
        m = body.model
        with patched(m, "cos", m.cos.roll(-shift, 0)), patched(m, "sin", m.sin.roll(-shift, 0)):
            yield
    return _fused_layer(layer, around)


def fused_y_minus_bx():
    """layer_tail handed bx where it subtracts u."""
    return _fused_kernel("layer_tail", lambda f: lambda a, bx, u, *rest, **k: f(a, bx, bx, *rest,
                                                                                **k))


def fused_hpost_one():
    def wrap(f):
        def run(*a, **k):
            hpre, u, hpost, P, alpha, bx = f(*a, **k)
            return hpre, u, hpost * 0.5, P, alpha, bx      # exact: 1*s = (2*s)/2
        return run
    return _fused_kernel("mhc_route", wrap)


def fused_attn_gate_skipped():
    """The output product takes o itself, not o * gate."""
    from port.fused import FusedBody
    orig = FusedBody.product

    def product(self, x, gain, kind, prod, out=None):
        if kind == "mul":
            return orig(self, x, None, "none", prod, out)
        return orig(self, x, gain, kind, prod, out)
    return patched(FusedBody, "product", product)


def fused_residual_gate_skipped():
    """layer_tail handed 1 for sigmoid(attn_gate)."""
    def wrap(f):
        def run(*a, **k):
            a = list(a)
            a[7] = a[7].new_ones(())            # (a, bx, u, X, P, hpost, post, attn_gate, ...)
            return f(*a, **k)
        return run
    return _fused_kernel("layer_tail", wrap)


def hash_seed(xor: int = 1):
    import port.host as ph                  # the one place the host's n-gram rows are built
    return patched(ph, "SEED", ph.SEED ^ xor)


def y_minus_bx():
    return patched(V2Model, "layer", _mutated_layer("y_minus_bx", "y = q_(z + mo - u)",
                                                     "y = q_(z + mo - bx)"))


def hpost_one():
    """hpost = 1 * sigmoid(...) instead of 2 * sigmoid(...): the lanes' write-back halved."""
    return patched(V2Model, "layer", _mutated_layer("hpost_one", "hpost = q_(2 * sigmoid(",
                                                     "hpost = q_(1 * sigmoid("))


def attn_gate_skipped():
    return patched(V2Model, "attention",
                    _mutated_layer("attn_gate_skipped", "q_(o * gate)", "q_(o)", "attention"))


def residual_gate_skipped():
    return patched(V2Model, "layer", _mutated_layer(
        "residual_gate_skipped", "z = q_(bx + lw.attn_gate * ap)", "z = q_(bx + ap)"))


def _cq_missing() -> str:
    try:
        from port.cq import CqWeight
    except ImportError:
        return "the port has no CQ weights (no port.cq.CqWeight)"
    if not hasattr(CqWeight, "_prerotation") or not hasattr(V2Model, "from_cactfile"):
        return ("port.cq.CqWeight._prerotation (where norms scale the codes) or "
                "V2Model.from_cactfile is gone: the fault needs updating")
    return ""


def _as_f32(norms):
    """float16 norms as a reader that takes them for float32 sees them: element i is the 4
    bytes at offset 4i, i.e. fp16 elements 2i and 2i+1 glued together (zeros past the end,
    where a real reader would run into the next blob)."""
    import torch
    h = norms.reshape(-1).view(torch.int16).to(torch.int64) & 0xFFFF
    h = torch.cat([h, torch.zeros(h.numel(), dtype=torch.int64)])
    words = h[0::2][:norms.numel()] | (h[1::2][:norms.numel()] << 16)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.view(torch.float32).reshape(norms.shape)


def cq_norms_f32():
    """The CQ group norms (float16 in the file) read as float32 when the port expands its
    codes; acts at model load (CqWeight builds its rows then), dense compute form."""
    missing = _cq_missing()
    if missing:
        raise FaultError(f"fault cq_norms_f32: {missing}")
    from port.cq import CqWeight
    orig = CqWeight._prerotation

    def _prerotation(self, r0, r1):
        real = self.norms
        self.norms = _as_f32(real)
        try:
            return orig(self, r0, r1)
        finally:
            self.norms = real
    return patched(CqWeight, "_prerotation", _prerotation)


def cq_norms_f32_fused():
    """The same misread where the fused body reads the codes: the norms handed to its kernels
    (`CqWeight.kernel_operands`, taken when the model is built) are the float32 reading."""
    from port.cq import CqWeight
    orig = CqWeight.kernel_operands

    def kernel_operands(self, device=None):
        packed, norms, levels, bits = orig(self, device)
        return packed, _as_f32(norms), levels, bits
    return patched(CqWeight, "kernel_operands", kernel_operands)


def first_engram_row(cfg) -> int:
    """The first position with an in-range n-gram: min order - 1. Before it every n-gram
    reaches before position 0 and is masked, so Engram keys and values are exactly zero
    there (whatever the seed) and bx == u even on Engram layers."""
    return min(cfg.engram_orders) - 1


FAULTS = {f.name: f for f in (
    Fault("sinkhorn_19", "19 log-domain Sinkhorn iterations instead of 20",
          sinkhorn_iters, lambda cfg: ("L00.hres", 0), exact=False,
          native="NEEDLE_FAULT_SINKHORN_19", fused=fused_sinkhorn_iters),
    Fault("rope_pos_plus_1", "RoPE applied at pos+1 in layer 3 (q and k)",
          rope_shift, lambda cfg: ("L03.q", 0), native="NEEDLE_FAULT_ROPE_POS_PLUS_1",
          fused=fused_rope_shift),
    Fault("y_minus_bx", "y = block - bx instead of block - u (differs on Engram layers only)",
          y_minus_bx,
          lambda cfg: (f"L{min(cfg.engram_layers):02d}.y", first_engram_row(cfg)),
          native="NEEDLE_FAULT_Y_MINUS_BX", fused=fused_y_minus_bx),
    Fault("window_off_by_one", "attention window one position short",
          window_off_by_one, lambda cfg: ("L00.attn", cfg.kv_window - 1),
          native="NEEDLE_FAULT_WINDOW_SHORT"),
    Fault("engram_hash_seed", "Engram hash seed 0x9E3779B8 instead of 0x9E3779B9",
          hash_seed, lambda cfg: ("engram_k0", first_engram_row(cfg)), native=HOST),
    Fault("attn_gate_skipped", "attention output gate (sigmoid(gate_proj)) skipped",
          attn_gate_skipped, lambda cfg: ("L00.attn_out", 0),
          native="NEEDLE_FAULT_ATTN_GATE_SKIPPED", fused=fused_attn_gate_skipped),
    Fault("residual_gate_skipped", "sigmoid(attn_gate) on the attention residual skipped",
          residual_gate_skipped, lambda cfg: ("L00.mlp_in", 0),
          native="NEEDLE_FAULT_RESIDUAL_GATE_SKIPPED", fused=fused_residual_gate_skipped),
    Fault("hpost_one", "hpost = 1*sigmoid(...) instead of 2*sigmoid(...) (lane write-back)",
          hpost_one, lambda cfg: ("L00.hpost", 0), native="NEEDLE_FAULT_HPOST_ONE",
          fused=fused_hpost_one),
    # The Engram key projection is the first CQ product in forward order (the embedding row
    # is a lookup of the dequantised table, the same on both sides).
    Fault("cq_norms_f32", "CQ group norms (float16 in the file) read as float32",
          cq_norms_f32, lambda cfg: ("engram_k0", first_engram_row(cfg)), weights="cq",
          at_load=True, requires=_cq_missing, fused=cq_norms_f32_fused,
          not_native="the C step reads the norms port/native.py hands it as float32 tensors, "
                     "not through CqWeight._prerotation, and has no switch for this bug"),
)}


def describe() -> str:
    """One line per fault: name, first touched point (tiny preset), backends, what it is."""
    from reference.config import V2Config
    cfg = V2Config.preset("tiny")
    lines = []
    for f in FAULTS.values():
        point, pos = f.touches(cfg)
        where = ", ".join(b for b in BACKENDS if not f.not_in(b))
        form = "cq weights only" if f.weights == "cq" else "dense or cq"
        lines.append(f"{f.name:22s} first touches {point} at position {pos} (tiny); "
                     f"{form}; backends {where}: {f.what}")
    return "\n".join(lines)


def planted(name: str, backend: str = "torch", **kw):
    """`with planted("sinkhorn_19", "native"): ...` runs that backend with that fault."""
    if name not in FAULTS:
        raise KeyError(f"no fault {name!r}; known: {sorted(FAULTS)}")
    return FAULTS[name].plant_in(backend, **kw)
