"""needle v2 reference: a plain PyTorch restatement of upstream cactus-needle 2.0.8.

`decode.forward_cached` (Engram gated on u), `architecture.forward` / `hidden_cells` (the
training graph), `heads` (probe heads), on parameters keyed by upstream's flax paths.

The description of a model (config, params, the .cact container) is imported eagerly; the
math is imported on first use, so port/, which may read only the description
(docs/design.md, "Layout"), never loads the reference's math by importing this package.
"""
from importlib import import_module

from .config import ConfigError, V2Config
from .params import ParamsError, init_params, load_params, save_params

_LAZY = {
    "forward_cached": "decode", "init_kv_cache": "decode", "generate": "decode",
    "DecodeInputError": "decode",
    "read_cact": "cact", "write_cact": "cact", "build_cact": "cact", "CactFile": "cact",
    "CactFormatError": "cact",
    "encode_contrastive": "heads", "forward_confidence": "heads",
}

__all__ = ["V2Config", "ConfigError", "init_params", "load_params", "save_params",
           "ParamsError", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
