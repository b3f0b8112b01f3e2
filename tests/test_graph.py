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
            V2Model(tiny_cfg, V2Model.from_params(tiny_params, tiny_cfg).w, "cpu", decode="graph"))


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
    g = DecodeGraph(eager, state)
    seqs = {}
    for pos, tok in enumerate([5, 9, 200, 7, 7, 31, 2, 250, 4, 19, 88, 3]):   # wraps at 8
        seqs[pos] = record_body_ops(g, tok)
    first = seqs[0]
    assert len(first) > 100
    for pos, ops in seqs.items():
        assert ops == first, pos


def test_a_host_sync_in_the_body_is_caught(models, monkeypatch):
    eager, _ = models
    g = DecodeGraph(eager, eager.make_state())
    real = eager._mm

    def syncing(x, wt):
        float(x.sum())            # a hidden .item(): the kind of thing a capture cannot hold
        return real(x, wt)
    monkeypatch.setattr(eager, "_mm", syncing)
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
def test_cuda_graph_replay_equals_eager(tiny_cfg, tiny_params):
    eager = V2Model.from_params(tiny_params, tiny_cfg, device="cuda")
    graph = V2Model(tiny_cfg, eager.w, "cuda", decode="graph")
    a, b = eager.make_state(), graph.make_state()
    for t in range(1, 30):
        assert torch.equal(eager.step(t, a), graph.step(t, b))
        assert torch.equal(a.k, b.k) and torch.equal(a.lanes, b.lanes)
