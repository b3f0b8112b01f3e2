"""tests/ports/toy_port.py's buggy port, noting whether each step ran in torch's inference
mode (tests/ladder/sides/test_inference_mode.py: a protocol port runs in its caller's mode)."""
from __future__ import annotations

import torch

from tests.ports.toy_port import build_buggy

MODES: list = []


class _Probe:
    def __init__(self, port):
        self.port = port

    def make_state(self):
        return self.port.make_state()

    def step_traced(self, token, state, logits, trace):
        MODES.append(torch.is_inference_mode_enabled())
        return self.port.step_traced(token, state, logits, trace)

    def step(self, token, state, logits=None):
        return self.step_traced(token, state, logits, None)


def build(params, cfg):
    return _Probe(build_buggy(params, cfg))
