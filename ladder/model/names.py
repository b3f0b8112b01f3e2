"""Point names and the protocol's error: `L07.y` for layer points, bare names for the rest.

The smallest piece of the engine: the registry (points.py), the ladder (trace.py) and the
name maps (namemap.py) all spell names through these two functions, so a name is built and
parsed in one place.
"""
from __future__ import annotations


class TraceError(ValueError):
    """A trace that breaks the protocol (a point twice, positions out of step, bad shapes)."""


_LAYER_POINTS: dict = {}     # (name, layer) -> "L07.y": a capture spells the same few hundred


def point_name(name: str, layer) -> str:
    if layer is None:
        return name
    if type(layer) is int and type(name) is str:
        point = _LAYER_POINTS.get((name, layer))
        if point is None:
            point = f"L{layer:02d}.{name}"
            if len(_LAYER_POINTS) < 65536:  # bounded, whatever names a caller invents
                _LAYER_POINTS[name, layer] = point
        return point
    return f"L{int(layer):02d}.{name}"


def layer_of(point: str):
    """Layer index of `L07.y` (7); None for whole-forward points."""
    if len(point) > 4 and point[0] == "L" and point[1:3].isdigit() and point[3] == ".":
        return int(point[1:3])
    return None
