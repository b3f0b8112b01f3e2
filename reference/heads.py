"""Probe heads (upstream architecture.py): attention-pool the hidden cells, then project.

Both default to full causal attention (window 0) even though the LM path is windowed; below
`window` tokens the two coincide.
"""
from __future__ import annotations

import math

import torch

from .architecture import _acc, _dtype, dense, hidden_cells
from .config import V2Config


def probe_pool(cells, probes, keep=None, dtype=torch.float32):
    """cells [B, T, L+1, d], probes [P, d], keep [B, T] -> pooled [B, P*d] (probe-major)."""
    B, T, Lp1, d = cells.shape
    acc = _acc(dtype)
    flat = cells.reshape(B, T * Lp1, d).to(acc)                    # row t*(L+1) + l
    scores = torch.einsum("bcd,kd->bkc", flat, probes.to(acc)) / math.sqrt(d)
    if keep is not None:
        keep = keep.repeat_interleave(Lp1, dim=1)
        scores = torch.where(keep[:, None, :] > 0, scores, -torch.inf)
    w = torch.softmax(scores, dim=-1)
    return torch.einsum("bkc,bcd->bkd", w, flat).reshape(B, -1).to(dtype)


def _pooled(params, cfg, tokens, head, window, sink, dtype, flash):
    dt = _dtype(dtype or cfg.dtype)
    tokens = tokens.to(torch.int64)
    cells = hidden_cells(params, cfg, tokens, window=window, sink=sink, dtype=dt, flash=flash)
    keep = (tokens != cfg.pad_token_id).to(_acc(dt))
    return probe_pool(cells, params[f"{head}/probes"], keep, dt), dt


def encode_contrastive(params, cfg: V2Config, tokens, *, window: int = 0, sink=None,
                       dtype=None, flash=None):
    """Unit-norm embedding [B, contrastive_dim] (log_temp is training-only)."""
    pooled, dt = _pooled(params, cfg, tokens, "contrastive_head", window, sink, dtype, flash)
    p = dense(pooled, params["contrastive_head/proj/kernel"], dt)
    denom = torch.sqrt(torch.sum(p.to(_acc(dt)) ** 2, dim=-1, keepdim=True) + 1e-12)
    return p / denom.to(p.dtype)


def forward_confidence(params, cfg: V2Config, tokens, *, window: int = 0, sink=None,
                       dtype=None, flash=None):
    """Confidence logit [B] (f32): pooled @ W + b."""
    pooled, dt = _pooled(params, cfg, tokens, "confidence_head", window, sink, dtype, flash)
    logit = dense(pooled, params["confidence_head/proj/kernel"], dt) \
        + params["confidence_head/proj/bias"].to(dt)
    return logit[..., 0].to(_acc(dt))
