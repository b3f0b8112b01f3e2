"""The point registry (ladder/model/points.py) holds every implementation to one list of ladder
points: a point renamed, dropped, reordered or reshaped on any side stops the capture, and the
native library's capture table and struct sizes must match their ctypes mirror."""
import ctypes

import pytest
import torch

from kernels import native
from ladder.model import points
from ladder.sides.capture import capture_port
from ladder.sides.faults import _mutated_layer
from ladder.engine.trace import Ladder, TraceError
from tests.captures import clean_port_ladder, reference_ladder, setup
from port.model import V2Model
from ladder.engine.trace import schedule
from ladder.model.points import check_ladder, expected                  # noqa: E402
# ---------------------------------------------------------------- fixture bounds, edge and past


def test_every_side_records_the_registry_points():
    cfg = setup()[0]
    names = [n for n, _ in points.expected(cfg)]
    for ladder in (reference_ladder("dense"), clean_port_ladder("dense")):
        for st in ladder.steps:
            assert ladder.points(st.name) == names
    # alpha only where an Engram site is; q per head, k/v per KV head
    assert ("L01.alpha" in names) == (cfg.site_of_layer(1) is not None)
    assert ("L00.alpha" in names) == (cfg.site_of_layer(0) is not None)
    assert dict(points.expected(cfg))["L00.q"] == (cfg.num_heads, cfg.head_dim)


def _doctored(edit):
    src = reference_ladder("dense")
    values = dict(src.values)
    edit(values)
    return Ladder(src.steps, values, label="doctored")


def test_a_ladder_that_drifts_from_the_registry_is_refused():
    cfg = setup()[0]
    drop = lambda v: v.pop("decode00/L02.u")
    with pytest.raises(TraceError, match=r"decode00: .*missing \['L02.u'\]"):
        points.check_ladder(_doctored(drop), cfg)
    shape = lambda v: v.__setitem__("prefill/L00.hpre", torch.zeros(6, 5))
    with pytest.raises(TraceError, match=r"prefill/L00.hpre: shape \[6, 5\], the registry says "
                                         r"\[6, 4\]"):
        points.check_ladder(_doctored(shape), cfg)

    def swap(v):
        items = list(v.items())
        i = next(j for j, (k, _) in enumerate(items) if k == "prefill/L00.q")
        items[i], items[i + 1] = items[i + 1], items[i]
        v.clear()
        v.update(items)
    with pytest.raises(TraceError, match="out of forward order"):
        points.check_ladder(_doctored(swap), cfg)


def test_a_port_tracing_a_renamed_point_stops_the_capture(monkeypatch):
    cfg, params, _, tokens, prompt = setup()
    monkeypatch.setattr(V2Model, "layer", _mutated_layer("rename", '("u", u)', '("u2", u)'))
    with pytest.raises(TraceError, match=r"not in it \['L00.u2'"):
        capture_port(V2Model.from_params(params, cfg), tokens[:3], 2)


def test_the_native_table_matches_the_registry_and_the_library():
    points.check_native_captures(native.CAPTURES)
    lib = native.lib()
    assert tuple(lib.nat_capture_name(i).decode()
                 for i in range(lib.nat_capture_count())) == points.native_table()
    with pytest.raises(TraceError, match="native capture table"):
        points.check_native_captures(native.CAPTURES[::-1])
    with pytest.raises(TraceError, match="COARSE"):
        points.check_coarse(("hpre", "u"))


def test_a_mirror_that_drifts_from_the_c_library_is_refused(monkeypatch):
    lib = native.lib()
    native._check_mirrors(lib)                             # the shipped mirror fits
    swapped = native.CAPTURES[1::-1] + native.CAPTURES[2:]
    monkeypatch.setattr(native, "CAPTURES", swapped)
    with pytest.raises(native.NativeMismatch, match="the C step captures .*update CAPTURES"):
        native._check_mirrors(lib)
    monkeypatch.undo()

    class Short(ctypes.Structure):                         # NState without its last field
        _fields_ = native.NState._fields_[:-1]
    monkeypatch.setattr(native, "NState", Short)
    with pytest.raises(native.NativeMismatch, match=r"sizeof\(NState\) is \d+ bytes in the C "
                                                    r"library but \d+ in its ctypes mirror"):
        native._check_mirrors(lib)


@pytest.fixture(scope="module")
def registry_ladder(tiny_cfg):
    """A ladder holding exactly the registry's points (zeros), prefill of 2 + one decode."""
    steps = schedule([1, 2, 3], 2)
    vals = {f"{st.name}/{n}": torch.zeros(len(st.tokens), *shape)
            for st in steps for n, shape in expected(tiny_cfg)}
    return steps, vals


def _check(tiny_cfg, registry_ladder, edit):
    steps, vals = registry_ladder
    vals = dict(vals)
    edit(vals)
    check_ladder(Ladder(steps, vals, "probe"), tiny_cfg)


def test_check_ladder_passes_the_registry_itself(tiny_cfg, registry_ladder):
    _check(tiny_cfg, registry_ladder, lambda v: None)


def test_check_ladder_refuses_a_wrong_positions_axis(tiny_cfg, registry_ladder):
    def edit(v):
        v["prefill/L00.q"] = torch.zeros(1, *v["prefill/L00.q"].shape[1:])
    with pytest.raises(TraceError, match=r"prefill/L00.q: shape \[1, .*registry says \[2, "):
        _check(tiny_cfg, registry_ladder, edit)


def test_check_ladder_refuses_each_trailing_dim(tiny_cfg, registry_ladder):
    """Every trailing axis of every multi-axis point, one larger, is refused by name."""
    n = 0
    for name, shape in expected(tiny_cfg):
        for ax in range(len(shape)):
            def edit(v, ax=ax, name=name, shape=shape):
                bad = list(shape)
                bad[ax] += 1
                v[f"decode00/{name}"] = torch.zeros(1, *bad)
            with pytest.raises(TraceError, match=f"decode00/{name}: shape"):
                _check(tiny_cfg, registry_ladder, edit)
            n += 1
    assert n > len(expected(tiny_cfg))              # some points have two trailing axes


def test_check_ladder_refuses_missing_extra_and_reordered_points(tiny_cfg, registry_ladder):
    with pytest.raises(TraceError, match=r"missing \['L01.v'\]"):
        _check(tiny_cfg, registry_ladder, lambda v: v.pop("decode00/L01.v"))
    with pytest.raises(TraceError, match=r"not in it \['L01.extra'\]"):
        _check(tiny_cfg, registry_ladder,
               lambda v: v.update({"decode00/L01.extra": torch.zeros(1, 3)}))

    def drop_layer(v):                        # a whole layer: the list is cut, with a count
        for k in [k for k in v if k.startswith("decode00/L02.")]:
            v.pop(k)
    n = sum(1 for name, _ in expected(tiny_cfg) if name.startswith("L02."))
    assert n > 5
    with pytest.raises(TraceError, match=rf"missing \['L02\.[^]]*\] and {n - 5} more$"):
        _check(tiny_cfg, registry_ladder, drop_layer)

    def swap(v):                              # q and k exchange places in the dict's order
        items = list(v.items())
        i = next(j for j, (k, _) in enumerate(items) if k == "prefill/L00.q")
        items[i], items[i + 1] = items[i + 1], items[i]
        assert items[i][0] == "prefill/L00.k"
        v.clear()
        v.update(items)
    with pytest.raises(TraceError, match="out of forward order"):
        _check(tiny_cfg, registry_ladder, swap)
