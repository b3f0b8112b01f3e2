import math

import pytest
import torch
from hypothesis import given, strategies as st

from ladder.sides.reference_rules import rule_for

from reference.ops import (apply_rope, engram_indices, hadamard_mlp, rms_unit, rope_tables,
                           sinkhorn, walsh_matrix, zcrms)

M32 = 0xFFFFFFFF


def hash_by_hand(seq, pos, table, order, slots):
    """Spec §b.8 with Python integers: the oracle for engram_indices."""
    acc = (0x9E3779B9 * (table + 1)) & M32
    for j in range(order):
        tok = seq[pos - j] if pos - j >= 0 else 0
        acc = ((acc ^ (tok & M32)) * 0x01000193) & M32
    acc ^= acc >> 15
    return acc % slots


def test_engram_hash_hand_worked_first_position():
    # token 1 at position 0, table 0 (order 2): written out step by step.
    acc = 0x9E3779B9
    acc = ((acc ^ 1) * 0x01000193) & M32           # j = 0: the token itself
    acc = ((acc ^ 0) * 0x01000193) & M32           # j = 1: before the start hashes as 0
    acc ^= acc >> 15
    idx = engram_indices(torch.tensor([[1]]), (2, 3), 1, 97)
    assert int(idx[0, 0, 0]) == acc % 97


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=12),
       st.sampled_from([(2, 3), (1, 2, 4), (3,)]), st.integers(1, 3),
       st.integers(1, 10007))
def test_engram_hash_matches_python_integers(seq, orders, heads, slots):
    idx = engram_indices(torch.tensor([seq], dtype=torch.int64), orders, heads, slots)
    assert idx.shape == (1, len(seq), len(orders) * heads)
    for pos in range(len(seq)):
        for oi, order in enumerate(orders):
            for h in range(heads):
                t = oi * heads + h
                assert int(idx[0, pos, t]) == hash_by_hand(seq, pos, t, order, slots)


def test_sinkhorn_columns_sum_to_one_rows_nearly():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 4, 4, generator=g) * 2 + 4 * torch.eye(4)
    p = sinkhorn(logits)
    ones = torch.ones(64, 4)
    assert rule_for("ops/sinkhorn_columns").check(p.sum(-2), ones)
    assert rule_for("ops/sinkhorn_rows").check(p.sum(-1), ones)
    assert not rule_for("ops/sinkhorn_columns").check(p.sum(-1), ones)   # rows really are not
    assert rule_for("ops/f32_vs_f64").check(p, sinkhorn(logits.double()))


def test_sinkhorn_has_exactly_twenty_iterations():
    logits = torch.tensor([[3.0, -1.0, 0.5], [0.0, 2.0, -2.0], [1.0, 1.0, 4.0]]).double()
    assert not torch.equal(sinkhorn(logits), sinkhorn(logits, iters=19))
    assert not torch.equal(sinkhorn(logits), sinkhorn(logits, iters=21))


def test_norm_forms_against_float64():
    g = torch.Generator().manual_seed(1)
    x, s = torch.randn(5, 48, generator=g), torch.randn(48, generator=g) * 0.3
    x64, s64 = x.double(), s.double()
    want = (1 + s64) * x64 / torch.sqrt((x64 ** 2).mean(-1, keepdim=True) + 1e-6)
    assert rule_for("ops/f32_vs_f64").check(zcrms(x, s), want)
    want = x64 / torch.sqrt((x64 ** 2).mean(-1, keepdim=True) + 1e-6)
    assert rule_for("ops/f32_vs_f64").check(rms_unit(x), want)


def test_walsh_is_orthonormal_sylvester():
    for n in (1, 2, 8, 64):
        h = walsh_matrix(n, torch.float64)
        assert rule_for("ops/f64").check(h @ h, torch.eye(n, dtype=torch.float64))
        ref = torch.ones(1, 1, dtype=torch.float64)
        while ref.shape[0] < n:
            ref = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64), ref)
        assert torch.equal(h, ref / math.sqrt(n))


def test_hadamard_mlp_pads_and_truncates():
    g = torch.Generator().manual_seed(2)
    h = torch.randn(3, 48, generator=g, dtype=torch.float64)
    d1, d2, d3 = (torch.randn(64, generator=g, dtype=torch.float64) for _ in range(3))
    H = walsh_matrix(64, torch.float64)
    z = torch.cat([h, torch.zeros(3, 16, dtype=torch.float64)], -1)
    z1 = (d1 * z) @ H
    z2 = torch.nn.functional.silu(d2 * z1) @ H
    assert rule_for("ops/f64").check(hadamard_mlp(h, d1, d2, d3, 48), (d3 * z2)[:, :48])


def test_rope_is_a_rotation_of_half_split_pairs():
    hd, theta = 12, 10000.0
    cos, sin = rope_tables(hd, 40, theta, torch.float64)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, hd, generator=g, dtype=torch.float64)
    c = torch.complex(x[:, :hd // 2], x[:, hd // 2:])
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(40, dtype=torch.float64)[:, None] * inv
    r = c * torch.polar(torch.ones_like(ang), ang)
    assert rule_for("ops/f64").check(apply_rope(x, cos, sin), torch.cat([r.real, r.imag], -1))
    c32, s32 = rope_tables(hd, 40, theta)
    assert c32.dtype == torch.float32 and rule_for("ops/rope_f32_vs_f64").check(c32, cos)


@pytest.mark.parametrize("k,n", [(2048, 24), (512, 512), (512, 1536)])
def test_a_rows_product_does_not_depend_on_the_batch_at_two_threads(k, n):
    # The shipped router and output products: with 2 threads a batch of one let the BLAS
    # split the row's reduction (prefill_batch then differed from step_prefill by 4e-6).
    from port.ops import rowvecs
    g = torch.Generator().manual_seed(k + n)
    x, w = torch.randn(6, k, generator=g), torch.randn(k, n, generator=g)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        batched = rowvecs(x, w)
        for r in range(6):
            assert torch.equal(batched[r:r + 1], rowvecs(x[r:r + 1], w)), r
    finally:
        torch.set_num_threads(threads)
