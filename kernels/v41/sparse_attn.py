"""V4.1 sparse attention: one latent row per selected position, used as key and value by every
head (MQA), read from two row sources, with a per-head sink. Triton kernel and torch twin.

    row(j) = rows_a[j]            for 0 <= j < Na      (the window: chunk rows or the ring)
           = rows_b[j - Na]       for Na <= j          (the compressed cache)
    o[t, h] = Σ_j softmax_j(s)·row(j),  s_j = (q[t, h]·row(j))·scale, sink_h in the denominator

`-1` entries are absent; a query with nothing selected gets zeros. Both implementations walk the
selection in tiles of BLOCK entries with an online softmax after padding it with `-1` to whole
tiles, so appending `-1` entries only adds empty tiles or fills lanes that were masked anyway:
it changes no bit of the result (kernels/sparse_attn.py gives the argument in full). That lets a
captured decode step launch one fixed selection width at every position. Rows are read in their
own dtype (bf16 in V4.1) and computed in float32; the result is float32.

Numerics follow the official V4.1 kernel: the running max starts at -1e30 and excludes the sink,
each tile's probabilities exp(s - running max) enter the denominator in float32 and weight the
rows rounded to bf16, and exp(sink - max) joins the denominator at the end. A tile of absent
entries leaves (max, sum, accumulator) unchanged bit for bit (rescale exp(0) = 1, terms 0).
"""
from __future__ import annotations

import torch

BLOCK = 64                 # the official kernel's tile
FLOOR = -1e30              # its running-max floor: an all-absent query gives zeros
# exp(sink - max) is capped at e^88 (finite in f32): an all-absent query (max = -1e30) then
# divides 0 by a finite number instead of by inf; only a sink 88 nats above every score differs
SINK_EXP_MAX = 88.0

try:
    import triton
    import triton.language as tl
except ImportError:                        # pragma: no cover
    triton = None


class SparseAttnV41Error(ValueError):
    """Inputs the two-source sparse attention refuses (names the argument, shape and rule)."""


def _check(q, rows_a, rows_b, idx, sink):
    if q.dim() != 3 or rows_a.dim() != 2 or rows_a.shape[1] != q.shape[2]:
        raise SparseAttnV41Error(f"q must be [T, H, D] and rows_a [Na, D=q's D]; got "
                                 f"{list(q.shape)}, {list(rows_a.shape)}")
    if rows_b is not None and (rows_b.dim() != 2 or rows_b.shape[1] != q.shape[2]):
        raise SparseAttnV41Error(f"rows_b must be [Nb, D={q.shape[2]}], got {list(rows_b.shape)}")
    if idx.dim() != 2 or idx.shape[0] != q.shape[0] or idx.dtype not in (torch.int32,
                                                                        torch.int64):
        raise SparseAttnV41Error(f"idx must be integer [T={q.shape[0]}, K], got {idx.dtype} "
                                 f"{list(idx.shape)}")
    if tuple(sink.shape) != (q.shape[1],):
        raise SparseAttnV41Error(f"sink must be [H={q.shape[1]}], got {list(sink.shape)}")


def _rows_b(rows_b):
    return None if rows_b is None or rows_b.shape[0] == 0 else rows_b


def _padded(idx, block):
    width = max(1, -(-idx.shape[1] // block)) * block
    return torch.nn.functional.pad(idx.to(torch.int64), (0, width - idx.shape[1]), value=-1)


def sparse_attn_v41_torch(q, rows_a, rows_b, idx, scale: float, sink, block: int = BLOCK):
    _check(q, rows_a, rows_b, idx, sink)
    rows_b = _rows_b(rows_b)
    T, H, D = q.shape
    na = rows_a.shape[0]
    idx = _padded(idx, block)
    qf = q.float()
    m = torch.full((T, H), FLOOR, dtype=torch.float32, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros(T, H, D, dtype=torch.float32, device=q.device)
    for b0 in range(0, idx.shape[1], block):
        j = idx[:, b0:b0 + block]
        valid = j >= 0
        # gather, then widen (exact): widening the whole cache first would cost a pass over
        # max_seq_len // ratio rows per block
        r = rows_a[j.clamp(0, na - 1)].float()                          # [T, B, D]
        if rows_b is not None:
            rb = rows_b[(j - na).clamp(0, rows_b.shape[0] - 1)].float()
            r = torch.where((j >= na)[..., None], rb, r)
        r = torch.where(valid[..., None], r, 0.0)
        s = torch.einsum("thd,tbd->thb", qf, r) * scale
        s = torch.where(valid[:, None, :], s, -torch.inf)
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp(m - m_new)                                    # 1 exactly if unchanged
        p = torch.exp(s - m_new[..., None])                             # 0 for absent entries
        l = l * alpha + p.sum(-1)
        pv = torch.einsum("thb,tbd->thd", p.to(torch.bfloat16).float(), r)
        acc = acc * alpha[..., None] + pv
        m = m_new
    l = l + torch.exp((sink.float()[None, :] - m).clamp_max(SINK_EXP_MAX))
    return acc / l[..., None]


if triton is not None:
    @triton.jit
    def _sparse_attn_v41_kernel(q_ptr, a_ptr, b_ptr, idx_ptr, sink_ptr, o_ptr, K, NA, scale,
                                s_qt, s_qh, s_a, s_b, s_it, s_ot, s_oh, D: tl.constexpr,
                                BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
                                HAS_B: tl.constexpr):
        t = tl.program_id(0)
        h = tl.program_id(1)
        d = tl.arange(0, BLOCK_D)
        dmask = d < D
        q = tl.load(q_ptr + t * s_qt + h * s_qh + d, mask=dmask, other=0.0).to(tl.float32)
        m = tl.full((), -1e30, tl.float32)
        l = tl.zeros((), tl.float32)
        acc = tl.zeros((BLOCK_D,), tl.float32)
        for b in range(0, tl.maximum(tl.cdiv(K, BLOCK_K), 1)):
            offs = b * BLOCK_K + tl.arange(0, BLOCK_K)
            j = tl.load(idx_ptr + t * s_it + offs, mask=offs < K, other=-1).to(tl.int64)
            valid = j >= 0
            in_a = valid & (j < NA)
            r = tl.load(a_ptr + tl.where(in_a, j, 0)[:, None] * s_a + d[None, :],
                        mask=in_a[:, None] & dmask[None, :], other=0.0).to(tl.float32)
            if HAS_B:
                in_b = valid & (j >= NA)
                r += tl.load(b_ptr + tl.where(in_b, j - NA, 0)[:, None] * s_b + d[None, :],
                             mask=in_b[:, None] & dmask[None, :], other=0.0).to(tl.float32)
            s = tl.sum(r * q[None, :], axis=1) * scale
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new)
            l = l * alpha + tl.sum(p, axis=0)
            # bf16 round-to-nearest-even by integer ops: the interpreter's cast truncates
            bits = p.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            pb = bits.to(tl.float32, bitcast=True)
            acc = acc * alpha + tl.sum(pb[:, None] * r, axis=0)
            m = m_new
        sk = tl.load(sink_ptr + h).to(tl.float32)
        l = l + tl.exp(tl.minimum(sk - m, 88.0))               # SINK_EXP_MAX
        o = acc / l
        tl.store(o_ptr + t * s_ot + h * s_oh + d, o, mask=dmask)


def sparse_attn_v41_triton(q, rows_a, rows_b, idx, scale: float, sink, block: int = BLOCK,
                           out=None):
    """One program per (query, head); float32 result (into `out` when given: a captured graph
    keeps its output buffer)."""
    if triton is None:
        raise RuntimeError("Triton is not installed on this platform")
    _check(q, rows_a, rows_b, idx, sink)
    rows_b = _rows_b(rows_b)
    T, H, D = q.shape
    q, rows_a = q.contiguous(), rows_a.contiguous()
    has_b = rows_b is not None
    rows_b = rows_b.contiguous() if has_b else rows_a
    idx = _padded(idx, block).contiguous()
    if out is None:
        out = torch.empty(T, H, D, dtype=torch.float32, device=q.device)
    _sparse_attn_v41_kernel[(T, H)](q, rows_a, rows_b, idx, sink.float().contiguous(), out,
                                    idx.shape[1], rows_a.shape[0], float(scale),
                                    q.stride(0), q.stride(1), rows_a.stride(0), rows_b.stride(0),
                                    idx.stride(0), out.stride(0), out.stride(1), D=D,
                                    BLOCK_D=triton.next_power_of_2(D), BLOCK_K=block,
                                    HAS_B=has_b)
    return out


def sparse_attn_v41(q, rows_a, rows_b, idx, scale: float, sink, backend: str = "torch"):
    if backend == "torch":
        return sparse_attn_v41_torch(q, rows_a, rows_b, idx, scale, sink)
    if backend == "triton":
        return sparse_attn_v41_triton(q, rows_a, rows_b, idx, scale, sink)
    raise SparseAttnV41Error(f"backend={backend!r} is not 'torch' or 'triton'")
