"""The decode step split into host prep and a device body (port/graph.py): capturable (no host
sync, the same op sequence at every position) and bit-identical to the eager step."""
import pytest
import torch
from hypothesis import given, strategies as st

from port.graph import DecodeGraph, HostSyncError, record_body_ops
from port.model import StepError, V2Model

STATE = ("k", "v", "vraw", "lanes", "hidden", "logits")


@pytest.fixture(scope="module")
def models(tiny_cfg, tiny_params):
    return (V2Model.from_params(tiny_params, tiny_cfg),
            V2Model.new(tiny_cfg, *V2Model.from_params(tiny_params, tiny_cfg).parts, device="cpu",
                        decode="graph"))


@given(st.lists(st.integers(0, 255), min_size=1, max_size=30), st.integers(1, 8))
def test_graph_step_equals_eager_step_bit_for_bit(models, tokens, window):
    eager, graph = models
    a, b = eager.make_state(), graph.make_state()
    a.set_kv_window(window, eager)
    b.set_kv_window(window, graph)
    for t in tokens:
        assert torch.equal(eager.step(t, a), graph.step(t, b))
        for name in STATE:
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.history() == b.history()


def test_body_op_sequence_is_position_independent(models):
    eager, _ = models
    state = eager.make_state()
    eager.step(5, state)                             # position 0 is a prefill (eager)
    g = DecodeGraph(eager, state)
    seqs = {}
    for pos, tok in enumerate([9, 200, 7, 7, 31, 2, 250, 4, 19, 88, 3], start=1):  # wraps at 8
        seqs[pos] = record_body_ops(g, tok)
    first = seqs[1]
    assert len(first) > 100
    for pos, ops in seqs.items():
        assert ops == first, pos


def test_a_host_sync_in_the_body_is_caught(models, monkeypatch):
    eager, _ = models
    state = eager.make_state()
    eager.step(5, state)
    g = DecodeGraph(eager, state)
    real = eager.mm

    def syncing(x, wt):
        float(x.sum())            # a hidden .item(): the kind of thing a capture cannot hold
        return real(x, wt)
    monkeypatch.setattr(eager, "mm", syncing)
    with pytest.raises(HostSyncError, match="_local_scalar_dense"):
        record_body_ops(g, 3)


def test_graph_refuses_states_it_cannot_replay(models):
    eager, graph = models
    with pytest.raises(StepError, match="windowed ring state"):
        DecodeGraph(eager, eager.make_state_full_causal())
    state = graph.make_state()
    with pytest.raises(StepError, match="token id 300"):
        graph.step(300, state)
    assert state.pos == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU "
                    "(tools/device_check.sh runs this)")
@pytest.mark.parametrize("backend,weights,precision", [
    ("torch", "dense", None), ("torch", "cq", None), ("triton", "dense", None),
    ("triton", "cq", None), ("triton", "dense", "bfloat16"), ("triton", "dense", "float16"),
    ("triton", "cq", {"activations": "bfloat16", "weights": "cq", "kv": "bfloat16"})])
def test_cuda_graph_replay_equals_eager(tiny_cfg, tiny_params, backend, weights, precision):
    # triton: the fused body launched eagerly vs the same kernels replayed from one graph,
    # at every position and across the ring's wraps (window 8, 29 decode steps); also with
    # 16-bit activations, ring and dense weights.
    eager = V2Model.from_params(tiny_params, tiny_cfg, weights=weights, device="cuda",
                                backend=backend, precision=precision)
    graph = V2Model.new(tiny_cfg, *eager.parts, device="cuda", backend=backend,
                        decode="graph", precision=precision)
    a, b = eager.make_state(), graph.make_state()
    for t in range(1, 30):
        assert torch.equal(eager.step(t, a), graph.step(t, b)), t
        for name in STATE:
            assert torch.equal(getattr(a, name), getattr(b, name)), (t, name)


def test_attention_runtime_contract(models, tiny_cfg):
    from port.attn import AttnError
    eager, _ = models
    state = eager.make_state()
    rt = state.attn_runtime(eager)
    assert all(rt.decode_capturable(i) for i in range(tiny_cfg.num_layers))
    assert rt.decode_fixed_topk(0) == tiny_cfg.kv_window
    with pytest.raises(AttnError, match="start_pos=0 outside 1..max_seq_len-1=63"):
        rt.decode_prep(0, 0)
    with pytest.raises(AttnError, match="start_pos=64"):
        rt.decode_prep(0, 64)
    with pytest.raises(AttnError, match="layer 6 outside 0..5"):
        rt.decode_capturable(6)
    q, kv = torch.zeros(65, 4, 12), torch.zeros(65, 2, 12)
    with pytest.raises(AttnError, match="m=65 tokens outside 1..max_tokens=64"):
        rt.forward(0, q, kv, kv, 0)
    with pytest.raises(AttnError, match="positions 60..64 outside"):
        rt.forward(0, q[:5], kv[:5], kv[:5], 60)
    rt.decode_prep(0, 10)
    assert rt.idx_win.tolist() == [3, 4, 5, 6, 7, 0, 1, 2] and int(rt.slot) == 2
    with pytest.raises(AttnError, match="full-causal"):
        eager.make_state_full_causal().attn_runtime(eager).decode_fixed_topk(0)


@given(st.integers(1, 63))
def test_runtime_selection_is_the_official_window_selection(models, tiny_cfg, pos):
    from kernels.ring import window_topk_idxs
    eager, _ = models
    rt = eager.make_state().attn_runtime(eager)       # ring == window: slots are pos % window
    rt.decode_prep(0, pos)
    assert torch.equal(rt.idx_win, window_topk_idxs(tiny_cfg.kv_window, 1, pos)[0])


def test_capture_puts_the_state_back_before_the_first_replay(models, monkeypatch):
    """DecodeGraph._capture runs the body twice (warm-up, capture) and must leave the state
    where prep left it. On CPU a stand-in for the CUDA capture runs the body eagerly."""
    import port.graph
    eager, graph = models
    a, b = eager.make_state(), graph.make_state()
    for t in (5, 9, 200):
        eager.step(t, a)
        graph.step(t, b)
    g = b.decode_graph(graph)
    g.prep(7)
    before = {n: getattr(b, n).clone() for n in STATE}
    runs = []

    def stand_in(body):
        for _ in range(2):
            body()
            runs.append(any(not torch.equal(getattr(b, n), before[n]) for n in STATE))
        return "captured", None
    monkeypatch.setattr(port.graph, "cuda_capture", stand_in)
    g._capture()
    assert g.graph == "captured" and runs == [True, True]    # the body did write the state
    for n in STATE:
        assert torch.equal(getattr(b, n), before[n]), n
    # The first replay (here: the body once more) is then exactly the eager step.
    assert torch.equal(g.body(), eager.step(7, a))
    for n in STATE:
        assert torch.equal(getattr(a, n), getattr(b, n)), n
