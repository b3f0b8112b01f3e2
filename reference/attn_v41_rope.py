"""Rotary position tables and their application for V4.1 attention (attn_v41 spec §3.3).

A table is one complex64 number per (position, frequency): e^{i·p·f_k}, f_k = base^{-2k/rd}.
Compressed layers (ratio > 0) use YaRN: frequencies whose wavelength exceeds the training
context are divided by `factor`, with a linear ramp across the band between the corrected
dimensions of `beta_fast` and `beta_slow` rotations; window-only layers use the plain table.

Rotation acts on the last `rd` values of each row, consecutive pairs read as complex numbers,
in float32, each result rounded back to the row's dtype; the inverse rotation conjugates.
The float32 products are formed in the same order as the official code so that tables and
rotations agree bit for bit (index selections downstream are discrete).
"""
from __future__ import annotations

import math

import torch


def rope_table(rd: int, max_seq: int, base: float, yarn: bool = False, factor: float = 1.0,
               original_seq_len: int = 0, beta_fast: float = 32, beta_slow: float = 1):
    freqs = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    if yarn and original_seq_len > 0:
        def dim_for(rotations):          # the dimension that turns `rotations` times in context
            turns = original_seq_len / (rotations * 2 * math.pi)
            return rd * math.log(turns) / (2 * math.log(base))
        low = max(math.floor(dim_for(beta_fast)), 0)
        high = min(math.ceil(dim_for(beta_slow)), rd - 1)
        ramp = ((torch.arange(rd // 2, dtype=torch.float32) - low)
                / max(high - low, 1e-3)).clamp(0, 1)
        keep = 1 - ramp
        freqs = freqs / factor * (1 - keep) + freqs * keep
    angles = torch.outer(torch.arange(max_seq), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def rotate(x: torch.Tensor, table_rows: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """x [n, ..., d] (row t at table_rows[t], [n, rd/2]); returns a new tensor of x's dtype with
    the last rd = 2·table_rows.shape[-1] values of every row rotated."""
    rd = 2 * table_rows.shape[-1]
    head, tail = x[..., :-rd], x[..., -rd:]
    c = torch.view_as_complex(tail.float().unflatten(-1, (-1, 2)).contiguous())
    f = table_rows.conj() if inverse else table_rows
    f = f.reshape(f.shape[0], *([1] * (c.dim() - 2)), f.shape[-1])
    rotated = torch.view_as_real(c * f).flatten(-2).to(x.dtype)
    return torch.cat([head, rotated], dim=-1)
