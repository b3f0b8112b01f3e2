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


def _sequences(tokens) -> tuple:
    """(list of token-id lists, batched?): [T] or [B, T], a tensor or nested lists."""
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() not in (1, 2):
            raise ValueError(f"probe heads take tokens [T] or [B, T], got {list(tokens.shape)}")
        seqs = tokens.tolist() if tokens.dim() == 2 else [tokens.tolist()]
        return [[int(t) for t in s] for s in seqs], tokens.dim() == 2
    tokens = list(tokens)
    batched = bool(tokens) and all(isinstance(s, (list, tuple, torch.Tensor)) for s in tokens)
    seqs = [s.reshape(-1).tolist() if isinstance(s, torch.Tensor) else list(s)
            for s in tokens] if batched else [tokens]
    return [[int(t) for t in s] for s in seqs], batched


def run_pool(model, tokens: list, head: str, window: int = 0):
    """One sequence's pooled cells [P*d] and the head's weights. window 0: full causal (as
    upstream's heads default to); w > 0: each position attends to the w most recent."""
    w = model.heads
    if f"{head}/probes" not in w:
        raise ValueError(f"this model has no {head} parameters")
    if not tokens:
        raise ValueError("probe heads need at least one token")
    cfg = model.cfg
    # Upstream's heads run the training graph, whose window also cuts the Engram n-grams and
    # taps reaching further back; this port's Engram follows decode.py and never cuts them.
    # The two agree exactly when the window covers the Engram's reach, so only those run.
    reach = max(max(cfg.engram_orders) - 1, (cfg.engram_taps - 1) * cfg.engram_dilation) \
        if cfg.num_sites else 0
    if isinstance(window, bool) or not isinstance(window, int) or \
            not (window == 0 or reach < window <= cfg.max_seq_len):
        raise ValueError(f"window={window!r}: needs 0 (full causal) or an int in "
                         f"{reach + 1}..max_seq_len={cfg.max_seq_len}; narrower windows would "
                         f"also cut the Engram's reach of {reach} positions in upstream's "
                         f"heads, which this port does not model")
    state = model.make_state_full_causal()
    state.set_kv_window(window, model)
    state.pad_aware = True
    pool = StreamingPool(w[f"{head}/probes"])
    for t in tokens:
        model.check_step(t, state)
        model.rows([t], state, want_logits=False, pool=pool)
    return pool.pooled(), w


def _each(model, tokens, head, window, project):
    seqs, batched = _sequences(tokens)
    if not seqs:
        raise ValueError("probe heads need at least one sequence")
    outs = []
    for seq in seqs:
        pooled, w = run_pool(model, seq, head, window)
        outs.append(project(pooled, w))
    return torch.stack(outs) if batched else outs[0]


def encode_contrastive(model, tokens, *, window: int = 0):
    """Unit-norm embedding: [contrastive_dim] for tokens [T], [B, contrastive_dim] for [B, T]
    (pad tokens are not pooled and are never keys, as upstream's mask)."""
    def project(pooled, w):
        p = pooled @ w["contrastive_head/proj/kernel"]
        return p / torch.sqrt((p * p).sum() + 1e-12)
    return _each(model, tokens, "contrastive_head", window, project)


def confidence(model, tokens, *, window: int = 0):
    """Confidence logit: a scalar for tokens [T], [B] for [B, T]."""
    def project(pooled, w):
        return (pooled @ w["confidence_head/proj/kernel"] + w["confidence_head/proj/bias"])[0]
    return _each(model, tokens, "confidence_head", window, project)
