"""Ring arithmetic: the window selection by hand (spec §4.1 examples) and ring_put in both
implementations against plain indexing."""
import pytest
import torch
from hypothesis import given, strategies as st

from kernels.ring import RingError, ring_put_torch, ring_put_triton, triton, window_topk_idxs

needs_triton = pytest.mark.skipif(triton is None, reason="no Triton wheel on this platform")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def test_prefill_window_examples():
    s = window_topk_idxs(8, 12, 0)
    assert s.shape == (12, 8)
    assert s[0].tolist() == [0] + [-1] * 7
    assert s[7].tolist() == list(range(8))
    assert s[8].tolist() == list(range(1, 9))
    assert s[11].tolist() == list(range(4, 12))
    assert window_topk_idxs(8, 3, 0).tolist() == [[0, -1, -1], [0, 1, -1], [0, 1, 2]]


def test_decode_ring_examples():
    assert window_topk_idxs(8, 1, 3).tolist() == [[-1, -1, -1, -1, 0, 1, 2, 3]]
    assert window_topk_idxs(8, 1, 7).tolist() == [[0, 1, 2, 3, 4, 5, 6, 7]]
    assert window_topk_idxs(8, 1, 10).tolist() == [[3, 4, 5, 6, 7, 0, 1, 2]]


@given(st.integers(1, 16), st.integers(1, 80))
def test_decode_selection_is_the_window_oldest_first(window, pos):
    sel = window_topk_idxs(window, 1, pos)[0].tolist()
    real = [s for s in sel if s >= 0]
    want_positions = list(range(max(0, pos - window + 1), pos + 1))
    assert real == [p % window for p in want_positions]            # oldest first
    assert sel[:window - len(real)] == [-1] * (window - len(real))  # absent entries first


@pytest.mark.parametrize("impl", [ring_put_torch, pytest.param(ring_put_triton, marks=needs_triton)])
def test_ring_put_writes_pos_mod_window(impl):
    ring = torch.zeros(8, 2, 3, device=DEV)
    for pos in range(20):
        row = torch.full((2, 3), float(pos), device=DEV)
        impl(ring, row, torch.tensor([pos], device=DEV), 8)
        assert torch.equal(ring[pos % 8], row)
    assert sorted(ring[:, 0, 0].tolist()) == list(range(12, 20))


def test_bad_arguments():
    with pytest.raises(RingError, match="window=9 outside 1..ring slots=8"):
        ring_put_torch(torch.zeros(8, 4), torch.zeros(4), torch.tensor([0]), 9)
    with pytest.raises(RingError, match="pos must be one integer"):
        ring_put_torch(torch.zeros(8, 4), torch.zeros(4), torch.tensor([0.0]), 8)
    with pytest.raises(RingError, match="takes m=1 query"):
        window_topk_idxs(8, 2, 5)
