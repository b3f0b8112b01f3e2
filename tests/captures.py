"""Shared, cached captures for the ladder tests (one reference and one clean port run per
session: every fault test compares against the same two ladders). Callers must not mutate."""
from tests import paths
import functools
import os

from ladder.sides.capture import capture_port, capture_reference
from ladder.cli.main import DEFAULT_PROMPT, DEFAULT_STEPS
from ladder.sides.fixtures import seeded_tokens
from port.model import V2Model
from reference.config import V2Config
from reference.params import init_params

# From this file, not the working directory: the suite runs from anywhere.
FIXTURE = os.path.join(paths.FIXTURES,
                       "v2_forward_vectors")


@functools.lru_cache(None)
def setup():
    """(cfg, params, model, tokens, prompt_len): what `python -m ladder run` uses by default."""
    cfg = V2Config.preset("tiny")
    params = init_params(cfg, 0, perturbed=True)
    tokens = seeded_tokens(cfg, DEFAULT_PROMPT + DEFAULT_STEPS, 0)
    return cfg, params, V2Model.from_params(params, cfg), tokens, DEFAULT_PROMPT


def cq_file():
    """The tiny parameters as the .cact writer quantises them (the port's default bits map)."""
    from reference.cact import build_cact
    cfg, params = setup()[:2]
    return build_cact(params, cfg, "embedding=4,mhc=4,default=2")


def port_model(weights="dense"):
    """A freshly built port model (faults that act at load need a fresh one)."""
    cfg, params = setup()[:2]
    if weights == "dense":
        return V2Model.from_params(params, cfg)
    return V2Model.from_cactfile(cq_file(), weights)


@functools.lru_cache(None)
def reference_ladder(weights="dense"):
    """The reference on the weights the port computes with (dequantised for "cq")."""
    cfg, params, _, tokens, prompt = setup()
    if weights != "dense":
        params = {k: v.float() for k, v in cq_file().params.items()}
    return capture_reference(params, cfg, tokens, prompt)


@functools.lru_cache(None)
def clean_port_ladder(weights="dense"):
    _, _, model, tokens, prompt = setup()
    if weights != "dense":
        model = port_model(weights)
    return capture_port(model, tokens, prompt)
