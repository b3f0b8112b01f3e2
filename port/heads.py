"""Probe heads on the port: attention-pool every hidden cell with a streaming softmax.

Upstream pools over all T·(L+1) cells of a sequence (x0 and the lane mean after each layer)
at once; here each cell is folded into a running (max, sum, weighted sum) per probe as the
step produces it, so nothing per position is kept. Exact up to reassociation.
"""
from __future__ import annotations

import math

import torch


class StreamingPool:
    def __init__(self, probes):
        self.probes = probes                                   # [P, d]
        P, d = probes.shape
        self.scale = math.sqrt(d)
        self.max = torch.full((P,), -torch.inf)
        self.sum = torch.zeros(P)
        self.acc = torch.zeros(P, d)

    def add(self, cells, keep):
        """cells [m, d]; keep [m] bool (pad positions are not pooled)."""
        if not bool(keep.any()):
            return
        cells = cells[keep]
        s = (cells @ self.probes.T) / self.scale                # [m, P]
        new_max = torch.maximum(self.max, s.max(0).values)
        rescale = torch.exp(self.max - new_max)
        e = torch.exp(s - new_max)                             # [m, P]
        self.sum = self.sum * rescale + e.sum(0)
        self.acc = self.acc * rescale[:, None] + e.T @ cells
        self.max = new_max

    def pooled(self):
        """[P*d], probe-major."""
        return (self.acc / self.sum[:, None]).reshape(-1)


def run_pool(model, tokens, head: str):
    w = model.w["heads"]
    if f"{head}/probes" not in w:
        raise ValueError(f"this model has no {head} parameters")
    tokens = [int(t) for t in (tokens.reshape(-1).tolist() if isinstance(tokens, torch.Tensor)
                               else tokens)]
    if not tokens:
        raise ValueError("probe heads need at least one token")
    state = model.make_state_full_causal()
    state.pad_aware = True
    pool = StreamingPool(w[f"{head}/probes"])
    for t in tokens:
        model._check(t, state, None)
        model._rows([t], state, None, None, False, pool)
    return pool.pooled(), w


def encode_contrastive(model, tokens):
    pooled, w = run_pool(model, tokens, "contrastive_head")
    p = pooled @ w["contrastive_head/proj/kernel"]
    return p / torch.sqrt((p * p).sum() + 1e-12)


def confidence(model, tokens):
    pooled, w = run_pool(model, tokens, "confidence_head")
    return (pooled @ w["confidence_head/proj/kernel"] + w["confidence_head/proj/bias"])[0]
