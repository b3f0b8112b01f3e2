"""sparse_attn: torch twin and Triton kernel (interpreter on CPU) against a float64 gather +
softmax, and the padding property both must hold bit for bit."""
from tests import paths
import math

import pytest
import torch
from hypothesis import given, strategies as st

from kernels.sparse_attn import (SparseAttnError, sparse_attn, sparse_attn_torch,
                                 sparse_attn_triton, triton)
from ladder.engine.rules import KERNEL_RULES
from ladder.sides.reference_rules import rule_for

needs_triton = pytest.mark.skipif(triton is None, reason="no Triton wheel on this platform")
# Real launches on a GPU (tools/device_check.sh); the interpreter on CPU (tests/conftest.py).
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def plain(q, k, v, idx, scale, sink=None):
    """float64 on the CPU, whatever device the inputs were built on: per query and head, softmax
    over the selected rows (sink in the denominator)."""
    q, k, v, idx = q.cpu().double(), k.cpu().double(), v.cpu().double(), idx.cpu()
    sink = None if sink is None else sink.cpu().double()
    T, H, D = q.shape
    rep = H // k.shape[1]
    out = torch.zeros(T, H, D, dtype=torch.float64)
    for t in range(T):
        sel = [int(j) for j in idx[t] if j >= 0]
        for h in range(H):
            if not sel:
                continue
            s = torch.stack([q[t, h] @ k[j, h // rep] for j in sel]) * scale
            if sink is not None:
                s = torch.cat([s, sink[h:h + 1]])
            w = torch.softmax(s, 0)[:len(sel)]
            out[t, h] = sum(w[n] * v[j, h // rep] for n, j in enumerate(sel))
    return out


def case(T=3, H=4, KV=2, D=12, N=20, K=9, seed=0, absent=0.3):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*s, generator=g) for s in ((T, H, D), (N, KV, D), (N, KV, D)))
    idx = torch.randint(0, N, (T, K), generator=g)
    idx[torch.rand(T, K, generator=g) < absent] = -1
    return q.to(DEV), k.to(DEV), v.to(DEV), idx.to(DEV)


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("with_sink", [False, True])
def test_against_float64(impl, with_sink):
    q, k, v, idx = case(K=37)
    idx[1] = -1                                           # an all-absent query
    sink = torch.tensor([0.5, -1.0, 2.0, 0.0], device=DEV) if with_sink else None
    scale = 1 / math.sqrt(12)
    got = sparse_attn(q, k, v, idx, scale, sink, backend=impl)
    want = plain(q, k, v, idx, scale, sink)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    assert rule_for(f"{impl}/sparse_attn", KERNEL_RULES).check(got.cpu(), want)


@needs_triton
def test_triton_matches_torch():
    q, k, v, idx = case(T=4, K=40, seed=3)
    a = sparse_attn_torch(q, k, v, idx, 0.3)
    b = sparse_attn_triton(q, k, v, idx, 0.3)
    assert rule_for("triton_vs_torch/sparse_attn", KERNEL_RULES).check(b, a)


@given(st.integers(1, 40), st.integers(0, 40), st.integers(0, 2**16), st.booleans())
def test_padding_changes_no_bit_torch(K, pad, seed, with_sink):
    q, k, v, idx = case(K=K, seed=seed)
    sink = torch.randn(4, generator=torch.Generator().manual_seed(seed)).to(DEV) if with_sink \
        else None
    padded = torch.nn.functional.pad(idx, (0, pad), value=-1)
    assert torch.equal(sparse_attn_torch(q, k, v, idx, 0.3, sink),
                       sparse_attn_torch(q, k, v, padded, 0.3, sink))


@needs_triton
@given(st.integers(1, 24), st.integers(1, 24), st.integers(0, 2**16))
def test_padding_changes_no_bit_triton(K, pad, seed):
    q, k, v, idx = case(T=2, K=K, seed=seed)
    padded = torch.nn.functional.pad(idx, (0, pad), value=-1)
    assert torch.equal(sparse_attn_triton(q, k, v, idx, 0.3), sparse_attn_triton(q, k, v, padded, 0.3))


def test_bad_shapes_named():
    q, k, v, idx = case()
    with pytest.raises(SparseAttnError, match=r"idx must be integer \[T=3, K\]"):
        sparse_attn_torch(q, k, v, idx.float(), 0.3)
    with pytest.raises(SparseAttnError, match="H=4 not a multiple of KV=3"):
        kv3 = torch.zeros(5, 3, 12, device=DEV)
        sparse_attn_torch(q, kv3, kv3, idx, 0.3)
    with pytest.raises(SparseAttnError, match=r"sink must be \[H=4\]"):
        sparse_attn_torch(q, k, v, idx, 0.3, torch.zeros(3, device=DEV))
    with pytest.raises(SparseAttnError, match="backend='cuda'"):
        sparse_attn(q, k, v, idx, backend="cuda")


def _launches_of(fn):
    """(Triton kernels launched, aten ops that launch a device kernel) of one call, counted the
    way tools/bench/count_launches.py counts a decode body (launches recorded, not run)."""
    import os
    import sys
    sys.path.insert(0, os.path.join(paths.TOOLS, "bench"))
    import count_launches as cl
    from port.graph import BodyRecorder
    with cl.triton_launches() as kernels, BodyRecorder("sparse_attn_triton") as rec:
        fn()
    return kernels, [op for op, *_ in rec.ops if cl.launches_op(op)]


@needs_triton
def test_ring_views_and_aligned_idx_launch_only_the_kernel():
    """The decode body passes ring views [R, KV, hd] of [L, KV, R, hd] and a tile-aligned int64
    selection: the wrapper must neither copy nor pad them (each copy is a launch per layer)."""
    g = torch.Generator().manual_seed(5)
    L, KV, R, hd, T, H = 2, 2, 24, 12, 2, 4
    k_ring, v_ring = (torch.randn(L, KV, R, hd, generator=g).to(DEV) for _ in range(2))
    k_rows, v_rows = k_ring[1].transpose(0, 1), v_ring[1].transpose(0, 1)
    assert not k_rows.is_contiguous()
    q = torch.randn(T, H, hd, generator=g).to(DEV)
    idx = torch.randint(-1, R, (T, 32), generator=g).to(DEV)
    sink = torch.randn(H, generator=g).to(DEV)
    kernels, ops = _launches_of(lambda: sparse_attn_triton(q, k_rows, v_rows, idx, 0.3, sink))
    assert kernels == ["_sparse_attn_kernel"] and ops == []
    got = sparse_attn_triton(q, k_rows, v_rows, idx, 0.3, sink)
    want = sparse_attn_triton(q, k_rows.contiguous(), v_rows.contiguous(), idx, 0.3, sink)
    assert torch.equal(got, want)


@needs_triton
def test_copies_only_what_the_kernel_cannot_walk():
    """A short idx is padded (one op); v with other strides than k is made contiguous (one
    copy; k already is); the results do not change."""
    q, k, v, idx = case(K=9)
    names = lambda ops: sorted(op.split(".")[1] for op in ops)
    assert names(_launches_of(lambda: sparse_attn_triton(q, k, v, idx, 0.3))[1]) == \
        ["constant_pad_nd"]
    vt = v.transpose(0, 1).contiguous().transpose(0, 1)              # same values, other strides
    assert names(_launches_of(lambda: sparse_attn_triton(q, k, vt, idx, 0.3))[1]) == \
        ["clone", "constant_pad_nd"]
    assert torch.equal(sparse_attn_triton(q, k, vt, idx, 0.3),
                       sparse_attn_triton(q, k, v, idx, 0.3))
