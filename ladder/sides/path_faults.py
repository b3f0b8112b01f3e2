"""Faults in one plain path only (`prefill_batch`, the decode body), which the one-position
`step_traced` never runs: the ladder itself stays clean and `capture_port(check_plain=True)`
must name the path, step and point where the path parts from it (`--plant NAME`, listed after
the layer-math faults of faults.py by `--list-faults`).
"""
from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass
from typing import Callable

from port.backend import TorchBackend, backend_class
from port.model import V2Model
from ladder.sides.faults import FaultError, first_engram_row, patched

def _mutated_method(fault: str, cls, method: str, old: str, new: str):
    """cls.<method> recompiled in its own module's globals with `old` replaced by `new`
    (exactly one occurrence), as _mutated_layer does for V2Model."""
    import sys
    src = textwrap.dedent(inspect.getsource(getattr(cls, method)))
    if src.count(old) != 1:
        raise FaultError(f"fault {fault}: expected exactly one {old!r} in {cls.__name__}."
                         f"{method}, found {src.count(old)}; the port changed, update the fault")
    code = compile(src.replace(old, new), f"<fault {fault}: {cls.__module__} {cls.__name__}."
                   f"{method}>", "exec")
    ns: dict = {}
    exec(code, sys.modules[cls.__module__].__dict__, ns)
    return patched(cls, method, ns[method])


def prefill_batch_only_engram_row():
    """Every row of a batched chunk adds the chunk's first Engram value row (`ev[:1]`, an
    indexing slip a one-row call cannot show): only `prefill_batch` runs more than one row."""
    return _mutated_method("prefill_batch_only_engram_row", V2Model, "layer",
                           "bx = q_(u + alpha * ev)", "bx = q_(u + alpha * ev[:1])")


def graph_body_only_rope_sin():
    """The decode body gathers its RoPE sin rows from the cos table (a copy-paste slip in
    port/graph.py DecodeGraph.body): only `--decode graph` on the torch backend runs it."""
    from port.graph import DecodeGraph
    return _mutated_method("graph_body_only_rope_sin", DecodeGraph, "torch_body",
                           "sin = model.sin.index_select(", "sin = model.cos.index_select(")


@dataclass(frozen=True)
class PathFault:
    """A bug in one plain path only, which the one-position `step_traced` never runs: the
    ladder itself stays clean, `capture_port(check_plain=True)` must name the path, the step
    and point (for the tiny preset, the default schedule) where it parts from it."""
    name: str
    what: str
    plant: Callable          # () -> context manager
    path: str                # the path as capture.PathError names it
    touches: Callable        # (cfg, prompt_len) -> (step, point, absolute position)
    decode: str = "eager"    # the decode mode the model needs for the path to run

    def not_in(self, backend: str, decode: str = "eager") -> str:
        """Why this path does not run as planted in `backend` / `decode` ("" when it does)."""
        cls = backend_class(backend)
        if cls.native:
            return "the C step runs its own batched rows and has no switch for this bug"
        if TorchBackend.runs_torch_body(self.decode) and not cls.runs_torch_body(decode):
            return ("the torch decode body runs only with --backend torch --decode graph "
                    "(the triton backend's body is port/fused.py)")
        return ""


PATH_FAULTS = {f.name: f for f in (
    PathFault("prefill_batch_only_engram_row", "each batched chunk row adds its chunk's first "
              "Engram value row (ev[:1])", prefill_batch_only_engram_row, "prefill_batch",
              lambda cfg, P: ("prefill", f"L{min(cfg.engram_layers):02d}.bx",
                              first_engram_row(cfg))),
    PathFault("graph_body_only_rope_sin", "the decode body's RoPE sin rows gathered from the cos "
              "table", graph_body_only_rope_sin, "the decode body",
              lambda cfg, P: ("decode00", "L00.q", P), decode="graph"),
)}


def describe_paths() -> str:
    """One line per path-only fault: name, path, where it first parts (tiny, default prompt)."""
    from reference.config import V2Config
    cfg = V2Config.preset("tiny")
    lines = []
    for f in PATH_FAULTS.values():
        step, point, pos = f.touches(cfg, 6)
        where = (f"torch --decode {f.decode}" if TorchBackend.runs_torch_body(f.decode)
                 else "torch, triton")
        lines.append(f"{f.name:22s} only in {f.path}: parts from step_traced at {step}/{point} "
                     f"position {pos} (tiny, prompt 6); backends {where}: {f.what}")
    return "\n".join(lines)
