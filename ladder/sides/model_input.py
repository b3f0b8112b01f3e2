"""Our model and its schedule from the command line's flags: --params, --cact or --preset, the
port built on them (--weights, --backend, --device, --decode), the seeded token stream. Shared
by the CLI's commands, sweeps and `judge`; LadderInputError is what each raises for a value it
refuses.
"""
from __future__ import annotations

import os

import torch

from ladder.sides import fixtures

from ladder.sides.defaults import DEFAULT_PROMPT, DEFAULT_STEPS  # noqa: F401  (re-exported)


class LadderInputError(ValueError):
    """A command-line value the ladder refuses (names the value and the limit)."""


def computing(args):
    """The mode a command or sweep case computes our own sides in: torch's inference mode.
    They compute no gradients, and dropping autograd's per-op bookkeeping makes a tiny
    `run` about 15 % cheaper with the same bits (tests/ladder/sides/test_inference_mode.py). A protocol
    port (`--port`) is the porter's code: it runs in the caller's mode."""
    import contextlib
    return contextlib.nullcontext() if getattr(args, "port", None) else torch.inference_mode()


def load_model(args):
    """(params, cfg, params_source, CactFile or None) from --params / --cact / --preset."""
    from reference.config import V2Config
    from reference.params import init_params, load_params
    if args.params and args.cact:
        raise LadderInputError("give one of --params and --cact, not both")
    from reference.memory_budget import check_memory
    f, budget = None, getattr(args, "max_memory", None)
    if args.params:
        params, cfg = load_params(args.params, max_memory=budget)
        src = {"source": "params", "file": os.path.basename(args.params)}
    elif args.cact:
        from reference.cact import read_cact
        f = read_cact(args.cact, max_memory=budget)
        params, cfg = f.params, f.config
        src = {"source": "cact", "file": os.path.basename(args.cact)}
    else:
        cfg = V2Config.preset(args.preset)
        check_memory(cfg, budget, f"--preset {args.preset}")
        params = init_params(cfg, args.seed, perturbed=True)
        src = {"source": "init", "preset": args.preset, "seed": args.seed, "perturbed": True}
    params = {k: v.float() for k, v in params.items()}
    src["sha256"] = fixtures.params_sha256(params)
    return params, cfg, src, f


def build_port(params, cfg, cactfile, args):
    """(reference params, port model, weight form). With CQ weights the port computes from
    the codes and the reference runs on the exactly dequantised weights: the same model."""
    from port.model import V2Model
    weights = args.weights or ("cq" if cactfile is not None else "dense")
    where = f"--weights {weights} --device {args.device}"
    prec = port_precision(args, weights)
    prec_arg = None if prec is None else prec.to_json()
    try:
        dev = torch.device(args.device)
    except RuntimeError as e:
        raise LadderInputError(f"--device {args.device}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise LadderInputError(f"--device {args.device}: torch.cuda.is_available() is False "
                               f"(torch {torch.__version__})")
    try:
        if weights == "dense":
            return params, V2Model.from_params(params, cfg, weights="dense",
                                               device=args.device, backend=args.backend,
                                               decode=args.decode, precision=prec_arg), weights
        if not hasattr(V2Model, "from_cactfile"):
            raise LadderInputError(f"{where}: this port has no V2Model.from_cactfile")
        if cactfile is None:
            from reference.cact import build_cact
            cactfile = build_cact(params, cfg, args.bits_map)
        ref = {k: v.float() for k, v in cactfile.params.items()}
        return ref, V2Model.from_cactfile(cactfile, weights, args.device, args.backend,
                                          args.decode, prec_arg), weights
    except LadderInputError:
        raise
    except (ValueError, RuntimeError) as e:
        raise LadderInputError(f"{where}: {e}") from None


def port_precision(args, weights: str = "dense"):
    """--port-precision as a Precision (None when not given); a CQ model's weights are its
    codes whatever the declaration says of them."""
    spec = getattr(args, "port_precision", None)
    if spec is None:
        return None
    from ladder.model.precision import Precision, PrecisionError
    try:
        prec = Precision.parse(spec, f"--port-precision {spec}")
    except PrecisionError as e:
        raise LadderInputError(str(e)) from None
    if weights == "cq" and prec.weights != "cq":
        prec = Precision(prec.activations, "cq", prec.kv)
    return prec


def schedule_tokens(args, cfg):
    """(token ids, prompt length) for --prompt-len/--steps/--seed: seeded, within max_seq_len."""
    n = args.prompt_len + args.steps
    if args.prompt_len < 1:
        raise LadderInputError(f"--prompt-len {args.prompt_len} must be >= 1")
    if args.steps < 0:
        raise LadderInputError(f"--steps {args.steps} must be >= 0")
    if n > cfg.max_seq_len:
        raise LadderInputError(f"--prompt-len + --steps = {n} exceeds max_seq_len="
                               f"{cfg.max_seq_len}")
    return fixtures.seeded_tokens(cfg, n, args.seed), args.prompt_len
