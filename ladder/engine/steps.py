"""A run's schedule: steps (a prefill, then one-token decode steps) and the names of its points
that the coarse ladder keeps. The pieces of a ladder that its file (archive.py) and the Ladder
itself (trace.py) both need.
"""
from __future__ import annotations

from dataclasses import dataclass

from ladder.model.names import TraceError, layer_of
from ladder.model.points import COARSE

TAIL = ("lane_mean", "final_norm", "logits")
CAPTURED = ("all", "last")


def is_coarse(point: str) -> bool:
    """The coarse ladder (docs/design.md): whole-forward points and the per-layer COARSE names."""
    layer = layer_of(point)
    return layer is None or point.split(".", 1)[1] in COARSE


@dataclass(frozen=True)
class Step:
    name: str              # "prefill", "decode00", ...
    pos: int               # absolute position of the step's first token
    tokens: tuple          # the step's token ids

    @property
    def positions(self) -> range:
        return range(self.pos, self.pos + len(self.tokens))


def schedule(tokens, prompt_len: int) -> list:
    """One prefill of `prompt_len` tokens, then one-token decode steps for the rest."""
    tokens = [int(t) for t in tokens]
    if not 1 <= prompt_len <= len(tokens):
        raise TraceError(f"prompt_len={prompt_len} must lie in 1..{len(tokens)} (the tokens)")
    n = len(tokens) - prompt_len
    width = max(2, len(str(n - 1)))
    return [Step("prefill", 0, tuple(tokens[:prompt_len]))] + \
        [Step(f"decode{i:0{width}d}", prompt_len + i, (tokens[prompt_len + i],))
         for i in range(n)]
