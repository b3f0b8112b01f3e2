"""tools/bench/count_launches.py: what counts as a launch, the Triton launch hook, and the body count
on the tiny preset (the triton backend's fused body, kernel by kernel; the torch body's Sinkhorn)."""
from tests import paths
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(paths.TOOLS, "bench"))
import count_launches as cl                                          # noqa: E402
import kernels.fwht as fwht                                           # noqa: E402
from port.model import V2Model                                       # noqa: E402


def test_views_and_allocations_launch_nothing():
    for op in ("aten.view.default", "aten.expand.default", "aten.select.int",
               "aten.slice.Tensor", "aten.empty.memory_format", "aten._unsafe_view.default"):
        assert not cl.launches_op(op), op
    for op in ("aten.mul.Tensor", "aten.logsumexp.default", "aten.copy_.default",
               "aten.zeros.default", "aten.index_select.default"):
        assert cl.launches_op(op), op


@pytest.mark.skipif(fwht.triton is None, reason="no Triton")
def test_triton_launches_are_recorded_not_run_and_the_hook_is_undone():
    x, out = torch.randn(2, 128, generator=torch.Generator().manual_seed(0)), torch.zeros(2, 128)
    launch = lambda: fwht._fwht_kernel[(2, 1)](x, out, 128, 1.0, G=128)
    with cl.triton_launches() as seen:
        launch()
        fwht.fwht_triton(x)
    assert seen == ["_fwht_kernel", "_fwht_kernel"]
    assert torch.equal(out, torch.zeros(2, 128))    # recorded, not run
    launch()                                         # the hook is undone: this one runs
    assert out.abs().sum() > 0


@pytest.mark.skipif(fwht.triton is None, reason="no Triton")
def test_body_counts_on_tiny(tiny_cfg, tiny_params):
    parts = V2Model.from_params(tiny_params, tiny_cfg).parts
    counts = {b: cl.count_body(V2Model.new(tiny_cfg, *parts, backend=b, decode="graph"))
              for b in ("torch", "triton")}
    L, S = tiny_cfg.num_layers, tiny_cfg.num_sites
    assert not any(k.startswith("triton:") for k in counts["torch"])
    assert counts["torch"]["aten.logsumexp.default"] == 2 * 20 * L     # the unfused Sinkhorn
    # the fused body: per layer router, q|k|v|gate and output products, routing, prelude,
    # attention, tail; per site the Engram prelude; the final norm and head; the embedding
    # row's gather and scale are its only aten ops
    assert counts["triton"] == {
        "triton:_norm_gemv_kernel": 3 * L + 1, "triton:_mhc_route_kernel": L,
        "triton:_qk_rope_ring_kernel": L, "triton:_sparse_attn_kernel": L,
        "triton:_layer_tail_kernel": L, "triton:_engram_dense_kernel": S,
        "triton:_final_norm_kernel": 1, "aten.index_select.default": 1,
        "aten.mul.Tensor": 1}
    cq = cl.count_body(V2Model.from_params(tiny_params, tiny_cfg, weights="cq",
                                           backend="triton", decode="graph"))
    assert cq["triton:_norm_cq_gemv_kernel"] == 3 * L + 1 and sum(cq.values()) == 7 * L + S + 4
    again = cl.count_body(V2Model.new(tiny_cfg, *parts, backend="triton", decode="graph"),
                          token=200)
    assert again == counts["triton"]                 # position- and token-independent


def test_without_triton_the_triton_count_is_refused_naming_the_extra(monkeypatch, capsys):
    # the default install (no 'gpu' extra) has no Triton: exit 2 and one line, no traceback
    real = cl.importlib.util.find_spec
    monkeypatch.setattr(cl.importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    assert cl.main(["--preset", "tiny", "--backends", "triton"]) == 2
    err = capsys.readouterr().err
    assert "needs Triton" in err and ".[gpu]" in err and "--backends torch" in err
