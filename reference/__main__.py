"""`python -m reference run`: the reference on the built-in tiny model (or a parameter file).

Builds the model, prefills a seeded prompt, decodes greedily past the attention window, and
prints the reference's self-consistency numbers (prefill vs one-token steps, decode vs the
training graph in f32 and bf16, float32 vs the float64 arbiter). Exit 0 when every number is
inside its tolerance rule, 1 when one is not, 2 on bad input.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from . import architecture
from .config import ConfigError, V2Config
from .decode import DecodeInputError, forward_cached, generate, init_kv_cache
from .memory_budget import DEFAULT_MAX_MEMORY, check_memory, cli_size
from .params import ParamsError, init_params, load_params, save_params
from bounded.io import InputFileError
from .self_checks import SELF_CHECKS, max_rel, within


def _model(args):
    if args.params:
        return load_params(args.params, max_memory=args.max_memory)
    cfg = V2Config.preset(args.preset)
    check_memory(cfg, args.max_memory, f"--preset {args.preset}")
    return init_params(cfg, args.seed, perturbed=not args.upstream_init), cfg


def _check_paths(args) -> None:
    """--params and --save before any work: not empty (an empty --params would silently run
    the preset), --save's directory existing and writable and the path not a directory."""
    import os
    for flag, value in (("--params", args.params), ("--save", args.save)):
        if value is not None and not value.strip():
            raise DecodeInputError(f"{flag} {value!r}: empty path; give a file or drop {flag}")
    if args.save:
        parent = os.path.dirname(os.path.abspath(args.save))
        if os.path.isdir(args.save):
            raise DecodeInputError(f"--save {args.save}: is a directory; give a file path")
        if not os.path.isdir(parent):
            raise DecodeInputError(f"--save {args.save}: directory {parent} does not exist")
        if not os.access(parent, os.W_OK):
            raise DecodeInputError(f"--save {args.save}: directory {parent} is not writable")


def run(args) -> int:
    for flag, value, low in (("--prompt-len", args.prompt_len, 1), ("--steps", args.steps, 0),
                             ("--window", 0 if args.window is None else args.window, 0)):
        if value < low:
            raise DecodeInputError(f"{flag} {value} must be >= {low}")
    if not -2 ** 63 <= args.seed < 2 ** 64:
        raise DecodeInputError(f"--seed {args.seed}: outside -2**63..2**64-1, the range torch "
                               f"seeds take")
    _check_paths(args)
    torch.manual_seed(args.seed)
    params, cfg = _model(args)
    if args.window is not None and args.window > cfg.max_seq_len:
        raise DecodeInputError(f"--window {args.window}: must lie in 0..max_seq_len="
                               f"{cfg.max_seq_len} (0: full causal)")
    window = cfg.kv_window if args.window is None else args.window
    n = args.prompt_len + args.steps
    if n > cfg.max_seq_len:
        raise DecodeInputError(f"prompt_len + steps = {n} exceeds max_seq_len={cfg.max_seq_len}")
    if args.save:                       # after every check: a refused run writes nothing
        save_params(args.save, params, cfg)
    g = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(1, cfg.vocab_size, (1, n), generator=g)
    print(f"needle v2 reference: d={cfg.d_model} L={cfg.num_layers} H={cfg.num_heads}/"
          f"{cfg.num_kv_heads} vocab={cfg.vocab_size} sites={cfg.engram_layers} window={window}")
    t0 = time.perf_counter()
    valid = torch.ones(1, n, dtype=torch.bool)
    kc, vc = init_kv_cache(cfg, 1, n)
    full, _, _ = forward_cached(params, cfg, tokens, kc, vc, 0, kv_window=window,
                                hist=tokens, hist_valid=valid)
    steps = []
    for p in range(n):
        lg, kc, vc = forward_cached(params, cfg, tokens[:, p:p + 1], kc, vc, p,
                                    kv_window=window, hist=tokens, hist_valid=valid)
        steps.append(lg)
    steps = torch.cat(steps, 1)
    kc, vc = init_kv_cache(cfg, 1, n)
    causal, _, _ = forward_cached(params, cfg, tokens, kc, vc, 0, kv_window=0)
    arch32 = architecture.forward(params, cfg, tokens, dtype="float32")
    arch16 = architecture.forward(params, cfg, tokens, dtype="bfloat16")
    p64 = {k: v.double() for k, v in params.items()}
    kc, vc = init_kv_cache(cfg, 1, n, torch.float64)
    causal64, _, _ = forward_cached(p64, cfg, tokens, kc, vc, 0, kv_window=0)
    rows = [("self/prefill_vs_steps", steps, full),
            ("self/decode_vs_arch_f32", arch32, causal),
            ("self/f32_vs_f64", causal, causal64),
            ("self/arch_bf16_vs_f32", arch16, causal)]
    ok = True
    print(f"\n{'check':28s} {'max|a-b|/max|b|':>16s} {'bound':>9s}  result")
    for name, a, b in rows:
        passed = within(name, a, b)
        ok &= passed
        print(f"{name:28s} {max_rel(a, b):16.3e} {SELF_CHECKS[name][0]:9.1e}  "
              f"{'pass' if passed else 'FAIL'}")
    same_argmax = bool(torch.equal(steps.argmax(-1), full.argmax(-1)))
    ok &= same_argmax
    print(f"{'argmax prefill == steps':28s} {str(same_argmax):>16s}")
    gen = generate(params, cfg, tokens[0, :args.prompt_len].tolist(), args.steps,
                   kv_window=window)
    print(f"\ngreedy continuation ({len(gen)} tokens): {gen}")
    print(f"elapsed {time.perf_counter() - t0:.2f} s, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}")
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reference", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the reference and print its self-consistency checks")
    r.add_argument("--preset", default="tiny", choices=["tiny", "shipped"])
    r.add_argument("--params", help="safetensors parameter file (config in its metadata)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--upstream-init", action="store_true",
                   help="upstream's degenerate init instead of the perturbed one")
    r.add_argument("--prompt-len", type=int, default=11)
    r.add_argument("--steps", type=int, default=21)
    r.add_argument("--window", type=int, default=None, help="attention window (default: config)")
    r.add_argument("--save", help="write the parameters used to this safetensors file")
    r.add_argument("--max-memory", type=cli_size, default=None, metavar="SIZE",
                   help=f"budget for the tables a geometry implies, e.g. 4G; larger ones are "
                        f"refused before allocating (default {DEFAULT_MAX_MEMORY >> 30}G)")
    args = ap.parse_args(argv)
    try:
        return run(args)
    except (ConfigError, ParamsError, DecodeInputError, InputFileError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
