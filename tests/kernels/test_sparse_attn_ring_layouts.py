"""sparse_attn on the selections the ring really produces: a decode step before the window has
filled selects `window` slots of which the oldest are not written yet, so the row starts with a
long run of `-1` (a whole 16-wide tile of it once window > 16, the shipped 256 included) and
ends with the valid slots. The online softmax must skip absent tiles without poisoning its
running max. Torch twin and Triton (the interpreter on CPU, tiny shapes) against the float64
gather + softmax, on the ring's layouts and on random ones with a leading absent run."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from kernels.ring import window_topk_idxs
from kernels.sparse_attn import BLOCK, sparse_attn_torch, sparse_attn_triton, triton
from ladder.engine.rules import KERNEL_RULES
from ladder.sides.reference_rules import rule_for
from tests.kernels.test_sparse_attn import plain as float64_attention

needs_triton = pytest.mark.skipif(triton is None, reason="no Triton wheel on this platform")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
IMPLS = {"torch": sparse_attn_torch, "triton": sparse_attn_triton}


def tensors(T, N, seed, H=2, KV=1, D=4):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*s, generator=g) for s in ((T, H, D), (N, KV, D), (N, KV, D)))
    return q.to(DEV), k.to(DEV), v.to(DEV)


def check(impl, q, k, v, idx):
    got = IMPLS[impl](q, k, v, idx.to(DEV), 0.5)
    want = float64_attention(q, k, v, idx, 0.5)
    assert rule_for(f"{impl}/sparse_attn", KERNEL_RULES).check(got.cpu(), want), \
        f"idx={idx.tolist()}: max|err| {float((got.cpu().double() - want).abs().max()):.3g}"
    return got


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("window", [20, 40])
def test_decode_selections_before_and_after_the_ring_fills(impl, window):
    """window_topk_idxs at every decode position up to one wrap: at pos < window - 16 the first
    tile is entirely `-1` and the valid slots sit in a later tile."""
    q, k, v = tensors(1, window, seed=window)
    positions = range(1, window + 2) if impl == "torch" else (1, 2, window - 1, window + 1)
    leading_tile_absent = 0
    for pos in positions:
        idx = window_topk_idxs(window, 1, pos)
        assert idx.shape == (1, window) and window > BLOCK
        leading_tile_absent += bool((idx[0, :BLOCK] < 0).all())
        got = check(impl, q, k, v, idx)
        assert bool(got.abs().sum() > 0)          # some key is valid: never all zeros
    assert leading_tile_absent > 0                # the layout under test occurred


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=needs_triton)])
def test_prefill_selection_over_a_window_wider_than_a_tile(impl):
    q, k, v = tensors(20, 20, seed=5)
    check(impl, q, k, v, window_topk_idxs(18, 20, 0))


def layout(K, lead, absent_mask, N, seed):
    """A row of K entries: `lead` leading -1, then rows < N with the masked ones absent."""
    g = torch.Generator().manual_seed(seed)
    row = torch.randint(0, N, (K,), generator=g)
    row[:lead] = -1
    row[lead:][torch.tensor(absent_mask[:K - lead], dtype=torch.bool)] = -1
    return row


@st.composite
def rows(draw, max_k):
    K = draw(st.integers(1, max_k))
    lead = draw(st.integers(0, K))
    mask = draw(st.lists(st.booleans(), min_size=K, max_size=K))
    return K, lead, mask, draw(st.integers(0, 2**16))


@given(rows(64), rows(64))
def test_random_layouts_with_a_leading_absent_run_torch(a, b):
    K = max(a[0], b[0])
    N = 24
    idx = torch.full((2, K), -1, dtype=torch.int64)
    for t, (k_, lead, mask, seed) in enumerate((a, b)):
        idx[t, :k_] = layout(k_, lead, mask, N, seed)
    q, k, v = tensors(2, N, seed=a[3])
    got = check("torch", q, k, v, idx)
    for t in range(2):
        assert bool((got[t].abs().sum() > 0)) == bool((idx[t] >= 0).any())


@needs_triton
@settings(max_examples=8)
@given(rows(40))
def test_random_layouts_with_a_leading_absent_run_triton(r):
    K, lead, mask, seed = r
    N = 12
    idx = layout(K, lead, mask, N, seed)[None]
    q, k, v = tensors(1, N, seed=seed)
    got = check("triton", q, k, v, idx)
    assert bool(got.abs().sum() > 0) == bool((idx >= 0).any())
