"""port/v41/attn.py against reference/v41/attn.py on the official fixture's inputs (torch twin:
every call; Triton under the interpreter: the first calls of one scenario), decode="graph"
bytes against eager on every capturable layer-step and the capturable body's op sequence (the
errors of spec §2.2 / §2.3: tests/reference/v41/test_refused_calls.py)."""
import pytest
import torch

from kernels.v41.sparse_attn import triton
from ladder.v41.sides import compare, graph_vs_eager, run_side
from port.v41.attn import AttnStackV41
from port.v41.graph import record_body_ops

needs_triton = pytest.mark.skipif(triton is None, reason="no Triton wheel on this platform")
DEV = "cuda" if torch.cuda.is_available() else "cpu"     # Triton: a GPU, else the interpreter


@pytest.fixture(scope="module")
def port_run(v41_fx):
    man, rec, w = v41_fx
    return run_side(AttnStackV41(man["model_args"], w), man, rec)


def _check(port_run, v41_ref_run, calls):
    cmp = compare(port_run, v41_ref_run, "v41_port", calls)
    assert cmp.rows and cmp.passed, f"{len(cmp.failures)} failing points, first {cmp.first}"
    return cmp.rows


def test_port_torch_matches_reference(v41_fx, v41_ref_run, port_run):
    man, rec, w = v41_fx
    rows = _check(port_run, v41_ref_run, man["calls"])
    assert {"topk_idxs", "window_idxs", "latent", "index_q", "compressed_rows"} <= \
        {r.point.split(".", 1)[1] for r in rows}


@needs_triton
def test_port_triton_matches_reference(v41_fx, v41_ref_run):
    man, rec, w = v41_fx
    calls = [c for c in man["calls"] if c["scenario"] == "p3"][:3]     # prefill 3, decode 3, 4
    port = AttnStackV41(man["model_args"], w, backend="triton", device=DEV)
    _check(run_side(port, man, rec, calls), v41_ref_run, calls)


def test_graph_decode_equals_eager_bytes(v41_fx, port_run):
    """Against the eager port's recorded outputs (port_run: the same eager runtime, all calls)."""
    man, rec, w = v41_fx
    graph = AttnStackV41(man["model_args"], w, decode="graph")
    n, bad = graph_vs_eager(None, graph, man, rec, port_run)
    assert n >= 200 and not bad, f"{len(bad)} of {n} capturable layer-steps differ: {bad[:3]}"


def _prefilled(v41_fx, scenario="p13"):
    """A port stack after the scenario's prefill, and its decode calls."""
    man, rec, w = v41_fx
    calls = [c for c in man["calls"] if c["scenario"] == scenario]
    st = AttnStackV41(man["model_args"], w)
    run_side(st, man, rec, calls[:1])
    return st, calls[1:], rec


def test_body_is_capturable_and_position_independent(v41_fx):
    """No host sync in the body, and the same op sequence at every position (so one capture
    serves all), for a window layer and a ratio-2 and a ratio-1 reuse layer; the body's output
    equals the eager step's bytes."""
    st, calls, rec = _prefilled(v41_fx)
    eager, _, _ = _prefilled(v41_fx)
    seen = {}
    for c in calls[:4]:
        for layer in range(8):
            x = rec[c["key"]][layer]["x"]
            want = eager.forward(layer, x, c["start_pos"])
            if not st.decode_capturable(layer):
                st.forward(layer, x, c["start_pos"])
                continue
            ops, res = record_body_ops(st, layer, x, c["start_pos"])
            assert torch.equal(res["out"], want), (c["key"], layer)
            assert seen.setdefault(layer, ops) == ops, f"layer {layer}: op sequence changed"
    assert set(seen) == {0, 1, 3, 5, 7}


def test_classes_and_widths(v41_fx):
    man, _, w = v41_fx
    st = AttnStackV41(man["model_args"], w)
    assert [st.decode_capturable(i) for i in range(8)] == [True, True, False, True, False,
                                                         True, False, True]
    assert [st.decode_fixed_topk(i) for i in range(8)] == [8, 8, 14, 14, 14, 14, 14, 14]


def test_prep_pads_with_minus_one_and_uploads_only_changes(v41_fx):
    st, calls, rec = _prefilled(v41_fx, "p3")
    c = calls[0]                                           # decode at position 3
    for layer in range(3):                                 # layers 0..2 publish for layer 3
        st.forward(layer, rec[c["key"]][layer]["x"], c["start_pos"])
    rows_b = st.decode_prep(3, 3)
    assert rows_b is st.shared["compress_kv"]
    assert st.idx_dev.tolist() == [[-1, -1, -1, -1, 0, 1, 2, 3, 8, 9] + [-1] * 4]
    assert st.decode_prep(0, 3) is None
    assert st.idx_dev_win.tolist() == [[-1, -1, -1, -1, 0, 1, 2, 3]]
    st.idx_dev.fill_(7)                                    # prep must not rewrite unchanged data
    st.decode_prep(3, 3)
    assert st.idx_dev.eq(7).all()
    st.invalidate_decode_uploads()
    st.decode_prep(3, 3)
    assert st.idx_dev[0, 8] == 8


# the refusals (spec §2.2 / §2.3) and their untouched state: tests/reference/v41/test_refused_calls.py
