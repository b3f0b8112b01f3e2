"""Rotary position tables and their application for V4.1 attention (attn_v41 spec §3.3).

A table is one complex64 number per (position, frequency): e^{i·p·f_k}, f_k = base^{-2k/rd}.
Compressed layers (ratio > 0) use YaRN: frequencies whose wavelength exceeds the training
context are divided by `factor`, with a linear ramp across the band between the corrected
dimensions of `beta_fast` and `beta_slow` rotations; window-only layers use the plain table.

Rotation acts on the last `rd` values of each row, consecutive pairs read as complex numbers,
in float32, each result rounded back to the row's dtype; the inverse rotation conjugates.
Tables and rotations must agree bit for bit with the official ones (index selections downstream
are discrete), so the few float32 steps whose order matters say so where they happen.
"""
from __future__ import annotations

import math

import torch


def _yarn_band(rd: int, base: float, original_seq_len: int, beta_fast: float,
               beta_slow: float) -> tuple:
    """The frequency indices [lo, hi] across which YaRN fades from the trained frequency to the
    stretched one: index k turns p·f_k radians over p positions, so over the training context
    it completes original_seq_len·f_k / 2π turns; lo is where that count falls to beta_fast,
    hi where it falls to beta_slow (solved for k, floored / ceiled, clipped to the table)."""
    def index_with_turns(turns: float) -> float:
        return rd * math.log(original_seq_len / (turns * 2 * math.pi)) / (2 * math.log(base))
    return (max(math.floor(index_with_turns(beta_fast)), 0),
            min(math.ceil(index_with_turns(beta_slow)), rd - 1))


def rope_table(rd: int, max_seq: int, base: float, yarn: bool = False, factor: float = 1.0,
               original_seq_len: int = 0, beta_fast: float = 32, beta_slow: float = 1):
    """complex64 [max_seq, rd/2]: row p holds e^{i·p·f_k}."""
    k = torch.arange(rd // 2, dtype=torch.float32)
    f = 1.0 / (base ** (2 * k / rd))              # 2k/rd is exact in f32, as the spec's 2k/rd
    if yarn and original_seq_len > 0:
        lo, hi = _yarn_band(rd, base, original_seq_len, beta_fast, beta_slow)
        stretched = ((k - lo) / max(hi - lo, 1e-3)).clamp(0, 1)   # 0 below the band, 1 above
        trained = 1 - stretched
        # spec §3.3 forces this float order for bit-equal tables: the weights are formed as
        # w = 1 - ramp and 1 - w (not ramp itself), then f/factor·(1 - w) + f·w
        f = f / factor * (1 - trained) + f * trained
    angle = torch.arange(max_seq, dtype=torch.float32)[:, None] * f[None, :]
    return torch.polar(torch.ones_like(angle), angle)


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
