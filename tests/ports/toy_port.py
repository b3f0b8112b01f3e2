"""A small needle v2 port that owes nothing to port/: the protocol of ladder/sides/ports.py over a
plain full-length KV cache, one `forward_cached` call per token. `build_buggy` plants a bug in
layer 2's lane-output coefficients (hpost), so `locate` must blame that layer and no other."""
from __future__ import annotations

import torch

from reference.decode import forward_cached, init_kv_cache

HEADS = ("q", "k", "v")


class ToyState:
    def __init__(self, cfg, dtype):
        self.k, self.v = init_kv_cache(cfg, 1, cfg.max_seq_len, dtype)
        self.tokens = []
        self.window = cfg.kv_window


class ToyPort:
    def __init__(self, params, cfg):
        self.params, self.cfg = params, cfg

    def make_state(self):
        return ToyState(self.cfg, self.params["embedding/embedding"].dtype)

    def step_traced(self, token, state, logits, trace):
        pos = len(state.tokens)
        state.tokens.append(int(token))
        hist = torch.tensor([state.tokens], dtype=torch.int64)

        def one_position(name, layer, values):
            v = values[0]
            v = v[:, -1] if name in HEADS and layer is not None else v[-1]
            trace(name, layer, v)
        out, state.k, state.v = forward_cached(
            self.params, self.cfg, hist[:, pos:pos + 1], state.k, state.v, pos,
            hist=hist, hist_valid=torch.ones_like(hist, dtype=torch.bool),
            trace=one_position if trace is not None else None)
        out = out[0, -1]
        if logits is not None:
            logits.copy_(out)
            return logits
        return out

    def step(self, token, state, logits=None):
        return self.step_traced(token, state, logits, None)


def build(params, cfg):
    return ToyPort(params, cfg)


def build_buggy(params, cfg):
    p = dict(params)
    a_post = p["stack/mhc_a_post"].clone()
    a_post[2] = a_post[2] * 1.05                 # layer 2's hpost gain 5% off
    p["stack/mhc_a_post"] = a_post
    return ToyPort(p, cfg)
