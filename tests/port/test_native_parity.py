"""Per-point parity across implementations: the torch port and the native C step, captured on
the same tokens (past the window, so the ring wraps), agree at every ladder point under the
port rules, dense and cq. Native's points are its own captures (the C step's `cap` table),
so a fault anywhere inside the C layer shows at the point it touches, not just at the logits."""
import functools

import pytest

from ladder.sides.capture import capture_port
from ladder.engine.compare import compare_ladders
from ladder.engine.rules import DEFAULT_RULES
from tests.captures import cq_file, setup
from port.model import V2Model


@functools.lru_cache(None)
def _ladder(weights, backend):
    cfg, params, _, tokens, prompt = setup()
    if weights == "dense":
        model = V2Model.from_params(params, cfg, backend=backend)
    else:
        model = V2Model.from_cactfile(cq_file(), "cq", backend=backend)
    return capture_port(model, tokens, prompt, label=f"{backend}:{weights}")


@pytest.mark.parametrize("weights", ["dense", "cq"])
def test_native_and_torch_agree_point_by_point(weights):
    native, torch_ = _ladder(weights, "native"), _ladder(weights, "torch")
    cmp = compare_ladders(native, torch_, DEFAULT_RULES, prefix="port")
    assert list(native.keys()) == list(torch_.keys())          # the same points, same order
    assert cmp.passed, str(cmp)
    worst = max(cmp.rows, key=lambda r: r.error)
    print(f"{weights}: {len(cmp.rows)} points, worst {worst.key} at {worst.error:.3g} of "
          f"its allowance")
    # Two computations, not one: the C step rounds differently somewhere inside every layer.
    assert any(r.error > 0 for r in cmp.rows)


def test_a_c_only_fault_shows_at_its_point_against_the_torch_port():
    from kernels import native
    cfg, params, _, tokens, prompt = setup()
    model = V2Model.from_params(params, cfg, backend="native")
    with native.planted_build("NEEDLE_FAULT_HPOST_ONE"):
        bad = capture_port(model, tokens, prompt)
    cmp = compare_ladders(bad, _ladder("dense", "torch"), DEFAULT_RULES, prefix="port")
    assert cmp.first is not None and cmp.first.key == "prefill/L00.hpost", str(cmp)
