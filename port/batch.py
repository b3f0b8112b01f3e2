"""Batched prefill: feed many prompt tokens at once and leave the state exactly as the same
run of `step_prefill` calls would (same cache bits, same next-step logits)."""
from __future__ import annotations

import torch

from .errors import StepError


class V2Batch:
    """A reusable prefill workspace: chunks of at most `cap` positions per pass."""

    def __init__(self, model, cap: int = 64):
        if cap < 1:
            raise ValueError(f"cap={cap} must be >= 1")
        self.model, self.cap = model, int(cap)


def prefill_batch(model, tokens, state, batch: V2Batch, logits=None,
                  trace=None):
    """Feed `tokens` at the state's position; logits (when asked) for the last token only.

    Every token is checked before any is fed, so a bad one leaves the state untouched.
    `trace` (with `batched` true: each point once per chunk with the chunk's rows [m, ...];
    the tail points for the chunk's last row) sees the batched arithmetic itself."""
    if isinstance(tokens, torch.Tensor):
        if tokens.device != model.device:
            raise StepError(f"tokens are on {tokens.device}; the model is on {model.device}")
        tokens = tokens.reshape(-1).tolist()
    tokens = [int(t) for t in tokens]
    if not tokens:
        raise StepError("prefill_batch needs at least one token")
    if batch.model is not model:
        raise StepError("V2Batch was made for another model")
    if trace is not None and not model.impl.traces_batch:
        raise StepError("a traced prefill_batch needs every chunk row; the native C step "
                        "captures a call's first row only (trace it on torch or triton)")
    for t in tokens:
        model.check_step(t, state, logits=logits)
    end = state.pos + len(tokens)
    if end > model.cfg.max_seq_len:
        raise StepError(f"positions {state.pos}..{end - 1} run past max_seq_len="
                        f"{model.cfg.max_seq_len}")
    out = None
    for c0 in range(0, len(tokens), batch.cap):
        chunk = tokens[c0:c0 + batch.cap]
        last = c0 + batch.cap >= len(tokens)
        out = model.rows(chunk, state, logits=logits,
                         want_logits=last and logits is not None, trace=trace)
    return out
