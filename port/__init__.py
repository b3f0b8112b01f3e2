"""The accelerated needle v2 port (V2Model over its typed parts, V2State, V2Batch, CqWeight,
the AttnV41-style runtime).

May import from reference/ only config, params and cact (docs/design.md, "Layout").

    from port import V2Model, V2Batch
    model = V2Model.from_params(params, cfg)        # or V2Model.from_cact("m.cact")
    state = model.make_state()
"""
from .batch import V2Batch
from .cq import CqError, CqWeight
from .model import StepError, V2Model
from .parts import Embedding, PartError, V2Engram, V2Layer, V2Mhc
from .state import StateError, V2State

__all__ = ["V2Model", "V2State", "V2Batch", "CqWeight", "StepError", "StateError", "CqError",
           "PartError", "Embedding", "V2Layer", "V2Mhc", "V2Engram"]
