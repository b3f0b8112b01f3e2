"""needle v2 reference: a plain PyTorch restatement of upstream cactus-needle 2.0.8.

`decode.forward_cached` (Engram gated on u), `architecture.forward` / `hidden_cells` (the
training graph), `heads` (probe heads), on parameters keyed by upstream's flax paths.
"""
from .config import V2Config
from .params import init_params, load_params, save_params

__all__ = ["V2Config", "init_params", "load_params", "save_params"]
