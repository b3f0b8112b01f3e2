"""The registry (ladder/model/points.py) is the one copy of the point names: every other list of names
(port/ and kernels/ may not import the ladder, and the C program and the name maps are not
Python) is held to it here, so a rename or a new point that misses one of them fails this
file, not a user's run."""
import re

import pytest

from kernels import native
from ladder.formats.namemap import load_map
from ladder.model.points import COARSE, LAYER, POINTS, SITE, WHOLE, native_table
from reference.config import V2Config

CFG = V2Config.preset("tiny")
LAYER_NAMES = [p.name for p in POINTS if p.scope == LAYER]
WHOLE_NAMES = [p.name for p in POINTS if p.scope == WHOLE]
SHAPE = {p.name: tuple(p.shape(CFG)) for p in POINTS}


def test_the_fused_bodys_traced_and_hidden_lists_partition_the_layer_points():
    from port import fused
    assert set(fused.HIDDEN).isdisjoint(fused.LAYER_TRACED)
    assert set(fused.HIDDEN) | set(fused.LAYER_TRACED) == set(LAYER_NAMES)
    assert list(fused.LAYER_TRACED) == [n for n in LAYER_NAMES if n in fused.LAYER_TRACED]


def test_the_native_capture_shapes_are_the_registrys():
    from port.native import NativeModel
    sizes = NativeModel._capture_sizes(CFG)
    assert tuple(sizes) == native.CAPTURES == native_table()
    for name, shape in sizes.items():
        assert tuple(shape) == SHAPE[name], name


def test_the_c_programs_layer_order_is_the_registrys():
    """needle_trace.c writes the archive's keys in its own `layer_caps` order."""
    import os
    src = open(os.path.join(os.path.dirname(native.__file__), "needle_trace.c")).read()
    caps = open(os.path.join(os.path.dirname(native.__file__), "captures.h")).read()
    enum_to_name = dict(re.findall(r"F\((\w+), \"(\w+)\"\)", caps))
    body = re.search(r"layer_caps\[\] = \{([^}]*)\}", src).group(1)
    order = [enum_to_name[e.strip()[2:]] for e in body.split(",") if e.strip()]
    assert order == LAYER_NAMES


def test_needle_rs_names_are_registry_names_in_registry_order():
    from ladder.formats import needle_rs
    assert set(needle_rs.LAYER_ORDER) == set(COARSE)
    assert set(needle_rs.TAIL) | {"embed"} <= set(WHOLE_NAMES)


@pytest.mark.parametrize("name", ["needle-rs", "upstream-jax"])
def test_the_shipped_maps_name_only_registry_points(name):
    nm = load_map(name)
    site_names = {p.name for p in POINTS if p.scope == SITE}
    for rule in nm.points:
        for n in rule.names:
            base = n.rstrip("0123456789") if rule.ours == "{name}" else n
            assert base in SHAPE or base in site_names, (name, n)
    registry = [f"L00.{n}" for n in LAYER_NAMES] + WHOLE_NAMES
    for patterns, _ in nm.not_emitted:
        for p in patterns:
            hits = [r for r in registry + ["engram_k1", "engram_v1", "L05.x"]
                    if re.fullmatch(p.replace("{last}", "05").replace("*", ".*")
                                    .replace("[1-9]", "[1-9]"), r)]
            assert hits, (name, p)                     # a pattern that names nothing is stale
