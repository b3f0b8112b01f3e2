"""The capture protocol: record ladders from anything that speaks `trace(name, layer, values)`.

A ladder is every capture point of a run, per step (`prefill`, `decode00`, ...), in forward
order, as float32/float64 copies. A point is named `embed`, `engram_k0`, `L03.u`, ...; a key
is `{step}/{point}`, e.g. `decode03/L07.y` (docs/design.md). Every value carries a leading
position axis: `[S, ...]` for a step of S positions, so a prefill's positions are compared one
by one exactly like decode steps.

The two sides trace differently: the reference calls once per point with `[B, S, ...]`
(q/k/v as `[B, H, S, hd]`); the port calls once per point *per position* with one position's
value (q as `[H, hd]`, alpha a scalar). `ReferenceRecorder` and `PortRecorder` turn both into
the same `[S, ...]` layout.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ladder.model.names import TraceError, layer_of, point_name  # noqa: F401  (re-exported)
from ladder.engine import archive
from ladder.engine.steps import CAPTURED, TAIL, Step, is_coarse, schedule  # noqa: F401

HEADS = ("q", "k", "v")                   # reference layout [B, H, S, hd]


@dataclass
class Ladder:
    """Captured values of one run: `values["decode03/L07.y"]` is a tensor [S, ...]."""
    steps: list
    values: dict = field(default_factory=dict)      # insertion order = ladder order
    label: str = ""
    # "{step}/{point}" -> why the run could not show it (a fused kernel kept it in
    # registers; another implementation does not emit it): named, never silently missing.
    # Compared as neither pass nor fail.
    hidden: dict = field(default_factory=dict)
    # "all": each value holds every position of its step; "last": only the step's last
    # position (needle-rs's fixture records a prefill that way), a leading axis of 1.
    captured: str = "all"
    meta: dict = field(default_factory=dict)   # what produced it (an archive's manifest)

    def __post_init__(self):
        if self.captured not in CAPTURED:
            raise TraceError(f"Ladder.captured={self.captured!r}; one of {CAPTURED}")

    def first_pos(self, step) -> int:
        """Absolute position of the first row a value of `step` holds."""
        return step.pos + len(step.tokens) - 1 if self.captured == "last" else step.pos

    def last_only(self) -> "Ladder":
        """The same ladder holding only each step's last position (a view, no copy)."""
        if self.captured == "last":
            return self
        if hasattr(self.values, "last_only"):          # values read from a file, lazily
            vals = self.values.last_only()
        else:
            vals = {k: v[-1:] for k, v in self.values.items()}
        return Ladder(self.steps, vals, self.label, dict(self.hidden), "last", self.meta)

    def save(self, path, **manifest) -> str:
        """Write this ladder as a trace archive (ladder/engine/archive.py); returns the path."""
        return archive.save(self, path, **manifest)

    @classmethod
    def load(cls, path, max_memory=None, lazy: bool = False) -> "Ladder":
        """A trace archive read back (ladder/engine/archive.py); its manifest is `ladder.meta`;
        `lazy`: values read from the file step by step as they are used."""
        return cls(*archive.read(path, max_memory=max_memory, lazy=lazy))

    def keys(self) -> list:
        return list(self.values)

    def points(self, step: str) -> list:
        """The points `step` holds, in ladder order (indexed once per size of the ladder: a
        comparison asks this of every step, and a long ladder holds ~10^5 keys)."""
        index = self.__dict__.get("_by_step")
        if index is None or index[0] != len(self.values) or index[1] is not self.values:
            by = {}
            for k in self.values:
                st, _, p = k.partition("/")
                by.setdefault(st, []).append(p)
            index = self.__dict__["_by_step"] = (len(self.values), self.values, by)
        return list(index[2].get(step, ()))

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step {name!r}; steps: {[s.name for s in self.steps]}")

    def at(self, point: str, pos: int):
        """The value of `point` at absolute position `pos` (one position, no leading axis)."""
        for s in self.steps:
            if pos in s.positions:
                j = pos - self.first_pos(s)
                if j < 0:
                    raise KeyError(f"position {pos} of step {s.name} was not captured "
                                   f"(this ladder holds only each step's last position)")
                return self.values[f"{s.name}/{point}"][j]
        raise KeyError(f"position {pos} is in no step of this ladder")

    def has_at(self, point: str, pos: int) -> bool:
        try:
            self.at(point, pos)
            return True
        except KeyError:
            return False

    @property
    def tokens(self) -> list:
        return [t for s in self.steps for t in s.tokens]

    def __getitem__(self, key):
        return self.values[key]

    def __contains__(self, key):
        return key in self.values

    def __len__(self):
        return len(self.values)

    def __repr__(self):
        n = self.values.numel() if hasattr(self.values, "numel") else \
            sum(v.numel() for v in self.values.values())
        hid = f", {len(self.hidden)} not compared" if self.hidden else ""
        hid += ", last position of each step" if self.captured == "last" else ""
        return (f"Ladder({self.label or 'unnamed'}: {len(self.steps)} steps, "
                f"{len(self.values)} points{hid}, {n} values)")


def copy_values(v, dtype) -> torch.Tensor:
    v = v.detach()
    if dtype is None:
        dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
    if v.dtype == dtype and v.device.type == "cpu":
        return v.clone()                # what .to(copy=True) makes, in two thirds of its time
    return v.to(device="cpu", dtype=dtype, copy=True)


class ReferenceRecorder:
    """A trace for `reference.decode.forward_cached`: keeps batch row `row` as [S, ...]."""

    def __init__(self, ladder: Ladder, step: Step, row: int = 0, dtype=None, keep=None):
        self.ladder, self.step, self.row, self.dtype, self.keep = ladder, step, row, dtype, keep

    def __call__(self, name, layer, values):
        point = point_name(name, layer)
        if self.keep is not None and not self.keep(point):
            return
        v = values[self.row]
        if name in HEADS and layer is not None:
            v = v.transpose(0, 1)                       # [H, S, hd] -> [S, H, hd]
        S = len(self.step.tokens)
        if v.dim() < 1 or v.shape[0] != S:
            raise TraceError(f"{self.step.name}/{point}: shape {list(v.shape)} has no leading "
                             f"axis of the step's {S} positions")
        key = f"{self.step.name}/{point}"
        if key in self.ladder.values:
            raise TraceError(f"{key} traced twice in one call")
        self.ladder.values[key] = copy_values(v, self.dtype)


class PortRecorder:
    """A trace for the port's `step_traced`: one call per point per position.

    Call `next_position()` before each position's step and `finish()` after the step's last;
    every position must trace the same points in the same order."""

    def __init__(self, ladder: Ladder, step: Step, dtype=None, keep=None):
        self.ladder, self.step, self.dtype, self.keep = ladder, step, dtype, keep
        self.parts: dict = {}
        self.order: list = []
        self.j = -1
        self.k = 0              # points traced at this position, all in position 0's order
        self.seen = None        # this position's points once it leaves that order, else None

    def next_position(self):
        if self.j >= 0:
            seen = self.order[:self.k] if self.seen is None else self.seen
            if seen != self.order:
                raise TraceError(f"{self.step.name}: position {self.j} traced {len(seen)} "
                                 f"points, position 0 traced {len(self.order)} (or another "
                                 f"order)")
        self.j += 1
        self.k, self.seen = 0, None

    def __call__(self, name, layer, values):
        point = point_name(name, layer)
        if self.keep is not None and not self.keep(point):
            return
        j, k, order = self.j, self.k, self.order
        if j < 0:
            raise TraceError("PortRecorder: call next_position() before the first step")
        # the common case in O(1): the next point of position 0's order (whose names are
        # distinct, so it cannot repeat one this position traced)
        if j > 0 and self.seen is None and k < len(order) and order[k] == point:
            self.k = k + 1
            self.parts[point].append(copy_values(values, self.dtype))
            return
        if j == 0:
            if point in self.parts:
                raise TraceError(f"{self.step.name}/{point} traced twice at position 0")
            order.append(point)
            self.k = k + 1
        else:                           # off position 0's order: the list says which
            if self.seen is None:
                self.seen = order[:k]
            if point in self.seen:
                raise TraceError(f"{self.step.name}/{point} traced twice at position {j}")
            self.seen.append(point)
        self.parts.setdefault(point, []).append(copy_values(values, self.dtype))

    def finish(self):
        self.next_position()
        S = len(self.step.tokens)
        if self.j != S:
            raise TraceError(f"{self.step.name}: {self.j} positions traced, the step has {S}")
        for point in self.order:
            parts = self.parts[point]
            if any(p.shape != parts[0].shape for p in parts):
                raise TraceError(f"{self.step.name}/{point}: shape changes between positions")
            self.ladder.values[f"{self.step.name}/{point}"] = torch.stack(parts)
