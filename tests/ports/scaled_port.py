"""Our port at bfloat16 through the protocol (`--port`), honest or with one point scaled: the
systematic error a sweep's pooled statistics must find (tests/ladder/sweep/test_pooled.py)."""
from __future__ import annotations

from port import V2Model

LAYER = 2


def _bf16(params, cfg):
    return V2Model.from_params(params, cfg, precision="bfloat16")


def honest(params, cfg):
    return _bf16(params, cfg)


def _mlp_scaled(params, cfg, scale: float):
    port = _bf16(params, cfg)
    inner = port.mlp               # an instance attribute shadows the method the layer calls
    port.mlp = lambda i, h: port.rnd(inner(i, h) * (scale if i == LAYER else 1.0))
    return port


def mlp_1003(params, cfg):
    """Layer 2's MLP output 0.3 % too large at every position: inside one run's noise."""
    return _mlp_scaled(params, cfg, 1.003)


def mlp_102(params, cfg):
    """2 % too large: material in a single run."""
    return _mlp_scaled(params, cfg, 1.02)


def mlp_1001(params, cfg):
    """0.1 %: the issue's aim, for a sweep of many models."""
    return _mlp_scaled(params, cfg, 1.001)
