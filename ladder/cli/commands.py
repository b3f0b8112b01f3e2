"""`run`, `locate`, `report`, `regen` and `rules`: our port beside our reference.

compare_run is what the first three share (load the model, capture both sides, compare);
with_fault plants --plant's bug around any of them.
"""
from __future__ import annotations

import os
import tempfile
import time

import torch

from ladder.cli.args import check_model, schedule_note
from ladder.cli.progress import bar
from ladder.cli.show import print_table
from ladder.engine.compare import compare_ladders
from ladder.engine.rules import COMPARED_SIDES, DEFAULT_RULES, dump_rules, load_rules
from ladder.sides import fixtures
from ladder.sides.capture import capture_port, capture_reference
from ladder.sides.model_input import (LadderInputError, build_port, load_model,
                                      port_precision, schedule_tokens)
from ladder.sides.runinfo import describe_port, graph_verdict

def compare_run(args, out=print, keep: str = "all"):
    """Everything `run`, `locate` and `report` share: (comparison, ladders, model, info).
    keep: compare_ladders' (`run` without --per-step folds the rows, as `compare` does)."""
    torch.manual_seed(args.seed)
    rules = load_rules(args.rules) if args.rules else DEFAULT_RULES
    params, cfg, src, cactfile = load_model(args)
    check_model(args, cfg)                  # geometry-dependent flags, before any output
    t0 = time.perf_counter()
    if args.fixture:
        fx = fixtures.load(args.fixture, args.max_memory)
        fixtures.check_geometry(fx, cfg)
        params = fixtures.fixture_params(fx, None if src["source"] == "init" else params)
        if (args.weights or "dense") != "dense" and cactfile is None:
            raise LadderInputError(f"--weights {args.weights} quantises the parameters, but "
                                   f"the fixture holds the reference on them unquantised; "
                                   f"compare live (drop --fixture) or use a .cact fixture")
        tokens, prompt, window = fx.tokens, fx.prompt_len, fx.window
    else:
        tokens, prompt = schedule_tokens(args, cfg)
        window = cfg.kv_window if args.window is None else args.window
    params, model, weights = build_port(params, cfg, cactfile, args)
    prec = port_precision(args, weights)
    if prec is not None and prec.is_float32:
        prec = None
    if prec is not None and not args.rules:
        from ladder.engine.rules import NOISE_RULES
        rules = NOISE_RULES
    # The port steps on the state users get (make_state()) unless told otherwise: --window,
    # or a fixture recorded at another window than make_state()'s.
    port_window = args.window
    if args.fixture and port_window is None and model.make_state().window != window:
        port_window = window
    run = describe_port(model, weights, args.device, port_window)
    n = len(tokens)
    out(f"needle-parity ladder: {run.label()} vs "
        f"{'fixture ' + args.fixture if args.fixture else 'reference (float32)'}")
    for line in run.lines():
        out(line)
    out(f"model: {src['source']} {src.get('preset', src.get('file', ''))} d={cfg.d_model} "
        f"L={cfg.num_layers} H={cfg.num_heads}/{cfg.num_kv_heads} vocab={cfg.vocab_size} "
        f"Engram layers {list(cfg.engram_layers)} window={window}")
    wraps = schedule_note(n, run.ring, run.window)
    out(f"schedule: prompt {prompt} + {n - prompt} decode steps = {n} positions{wraps}")
    if args.rules:
        out(f"rules: {args.rules} ({len(rules.rules)} patterns; `python -m ladder rules "
            f"--rules {args.rules}` prints them)")
    if args.fixture:                  # the fixture stands in for the reference: not run live
        out(f"reference: not run; fixture {fx.path} stands in ({fx.manifest['values']}, "
            f"written by {fx.manifest['generator']}, torch {fx.manifest['torch_version']})")
    elif weights == "cq":
        out("reference: runs on the exactly dequantised weights (the port's CQ codes decoded "
            "to float32 without rounding), so both sides compute the same model")
    check = not args.no_check_plain
    if args.fixture:
        # on a failure the fixture itself is held to the reference (ladder/engine/stand_in.py)
        args.recompute_reference = lambda: capture_reference(
            params, cfg, tokens, prompt, window=window, label="reference (recomputed)")
        args.compare_rules = rules
    with bar((1 if args.fixture else 2) * n, "capturing") as pb:
        ta = time.perf_counter()
        ref = fx.ladder if args.fixture else capture_reference(
            params, cfg, tokens, prompt, window=window, check_plain=check, progress=pb,
            label="reference")
        tb = time.perf_counter()
        port = capture_port(model, tokens, prompt, window=port_window, check_plain=check,
                            progress=pb, label=run.label())
        tc = time.perf_counter()
    floor, tf = None, tc
    if prec is not None:
        from ladder.sides.noise_floor import capture_floor
        floor = capture_floor(params, cfg, tokens, prompt, prec, window=window)
        tf = time.perf_counter()
        out(f"noise floor: the reference re-run at {prec.short()} ({prec.text()}; "
            f"docs/precision.md), {tf - tc:.2f} s; rules {rules.source}")
    args.noise_floor, args.floor_precision, args.floor_params = floor, prec, params
    if check:
        out("tracing changes no bit: " + ("" if args.fixture else "reference traced == plain "
            "forward_cached; ") + "port step_traced == prefill_batch + step (logits and "
            "caches, torch.equal)")
    else:
        body = ", the decode body" if model.impl.runs_body else ""
        out(f"not checked (--no-check-plain): the port's plain paths (prefill_batch{body}, "
            f"step) did not run, so a bug only in them goes unseen, nor that tracing changes "
            f"no bit")
    if graph_verdict(model, check):
        out(graph_verdict(model, check))
    from ladder.engine.rules import UNIT_EPS
    from ladder.sides.own_error import own_sums
    own = own_sums(port, params, cfg, prec, window)   # each op re-run on the port's inputs
    cmp = compare_ladders(port, ref, rules, prefix="port", a_label=run.label(),
                          b_label=ref.label, keep=keep, floor=floor,
                          unit_eps=UNIT_EPS[prec.activations if prec else "float32"],
                          precision=prec, own=own)
    cmp.precision = prec
    extra = []
    td = time.perf_counter()
    info = {"model": f"{src['source']} {src.get('preset', src.get('file', ''))}",
            **run.as_info(),
            "params sha256": src["sha256"][:16], "seed": args.seed,
            "schedule": f"prompt {prompt} + {n - prompt} steps, window {window}",
            "rules": rules.source, "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "timing": ("reference not run (fixture)" if args.fixture else
                       f"reference {tb - ta:.2f} s") + f", port {tc - tb:.2f} s" +
                      (f", noise floor {tf - tc:.2f} s" if floor is not None else "") +
                      f", compare {td - tf:.2f} s, total {td - t0:.2f} s"}
    if prec is not None:
        info["precision"] = f"{prec.short()} ({prec.text()}), judged against a noise floor"
    return cmp, extra, port, ref, model, port_window, info


def other_model(args) -> bool:
    """True for --model attn_v41 (issue #8): its ladder lives in ladder/v41/sides.py."""
    return getattr(args, "model", "needle_v2") == "attn_v41"


def cmd_run(args, out=print) -> int:
    if getattr(args, "port", None) or getattr(args, "dump", None):
        from ladder.cli.compare import run_protocol_port
        return run_protocol_port(args, out, "run")
    if other_model(args):
        from ladder.v41.cli import cmd_run as v41_run
        return v41_run(args, out)
    # the table without --per-step needs each point's worst row only: folded, the rows of a
    # long schedule are never all built (the printed table and verdict are the same)
    cmp, extra, port, ref, *_, info = compare_run(
        args, out, "all" if getattr(args, "per_step", False) else "summary")
    print_table(cmp, args, out)
    out("")
    out(str(cmp))
    for c in extra:
        out(str(c))
    out(f"{info['timing']}; torch {info['torch']}, {info['port']}")
    ok = cmp.passed and all(c.passed for c in extra)
    if not cmp.passed and _stale_fixture(args, port, ref, out):
        return 1
    if not ok:
        out("divergence: `python -m ladder locate` (same options) scans its layer and "
            "splits local from propagated error")
    return 0 if ok else 1


def _stale_fixture(args, port, stored, out) -> bool:
    """With --fixture standing in for the reference and a point failing: if the fixture
    disagrees with the reference recomputed now, say so (the file, not the port, is wrong)
    and return True; the port's own verdict against the fixture would mislead."""
    if not args.fixture or not hasattr(args, "recompute_reference"):
        return False
    from ladder.engine.stand_in import check_stand_in
    si = check_stand_in(stored, port, args.recompute_reference(),
                        args.compare_rules, f"fixture {args.fixture}",
                        f"python -m ladder regen --out {args.fixture}")
    if not si.stale:
        return False
    out("")
    out(si.message())
    return True


def locate_run(args, cmp, port, ref, model, window):
    """`locate` of compare_run's result: our port's own layer re-run (engine/locate.py), or,
    for a port below float32, the reference's layer re-run at its precision on the port's
    inputs (ladder/sides/dump_locate.py: the split in noise units)."""
    floor = getattr(args, "noise_floor", None)
    if floor is None:
        from ladder.engine.locate import locate
        return locate(cmp, port=port, ref=ref, model=model, window=window)
    from ladder.sides.dump_locate import locate_dump
    win = model.make_state().window if window is None else window
    return locate_dump(cmp, port, ref, args.floor_params, model.cfg, win, floor=floor,
                       precision=args.floor_precision)


def cmd_locate(args, out=print) -> int:
    if getattr(args, "port", None) or getattr(args, "dump", None):
        from ladder.cli.compare import run_protocol_port
        return run_protocol_port(args, out, "locate")
    if other_model(args):
        from ladder.v41.cli import cmd_locate as v41_locate
        return v41_locate(args, out)
    cmp, extra, port, ref, model, window, info = compare_run(args, out)
    out("")
    out(str(cmp))
    if not cmp.passed and _stale_fixture(args, port, ref, out):
        return 1
    loc = locate_run(args, cmp, port, ref, model, window)
    out("")
    out(str(loc) if loc is not None else "no divergence: every point passes its rule")
    bad = [c for c in extra if not c.passed]
    for c in bad:
        out(str(c))
    return 0 if loc is None and not bad else 1


def cmd_report(args, out=print) -> int:
    if getattr(args, "port", None) or getattr(args, "dump", None):
        from ladder.cli.compare import run_protocol_port
        return run_protocol_port(args, out, "report")
    if other_model(args):
        from ladder.v41.cli import cmd_report as v41_report
        return v41_report(args, out)
    from ladder.engine.plot import fallback_note
    from ladder.engine.report import write_report
    cmp, extra, port, ref, model, window, info = compare_run(args, out)
    loc = locate_run(args, cmp, port, ref, model, window)
    paths = write_report(cmp, args.out, loc, info, stem=args.stem, plot_backend=args.plot)
    out(str(cmp))
    if fallback_note(args.plot):
        out(fallback_note(args.plot))
    for ext, p in paths.items():
        out(f"wrote {p} ({os.path.getsize(p)} bytes)")
    return 0 if cmp.passed and all(c.passed for c in extra) else 1


def cmd_regen(args, out=print) -> int:
    params, cfg, src, _ = load_model(args)
    check_model(args, cfg)
    tokens, prompt = schedule_tokens(args, cfg)
    with bar(2 * len(tokens), "reference f64 + f32") as pb:
        tensors, manifest = fixtures.build(params, cfg, tokens, prompt, params_source=src,
                                           seed=args.seed, window=args.window, progress=pb)
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    out(f"fixture: {len(manifest['ladder_order'])} ladder tensors over {len(tokens)} positions, "
        f"{size / 1e6:.2f} MB of values")
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            fixtures.write(os.path.join(tmp, "fx"), tensors, manifest)
            diff = fixtures.first_difference(args.out, os.path.join(tmp, "fx"))
        out(f"{args.out}.*: " + ("byte-identical to a fresh regeneration" if diff is None
                                  else f"DIFFER from a fresh regeneration: first at {diff}"))
        return 0 if diff is None else 1
    for p in fixtures.write(args.out, tensors, manifest):
        out(f"wrote {p} ({os.path.getsize(p)} bytes)")
    return 0


def cmd_rules(args, out=print) -> int:
    if args.rules:
        from ladder.engine.rules import V41_SIDES
        rs = load_rules(args.rules, V41_SIDES if args.model == "attn_v41" else COMPARED_SIDES)
    elif args.model == "attn_v41":
        from ladder.engine.rules import V41_RULESET
        rs = V41_RULESET
    elif getattr(args, "noise", False):
        from ladder.engine.rules import NOISE_RULES
        rs = NOISE_RULES
    else:
        rs = DEFAULT_RULES
    out(dump_rules(rs, args.format).rstrip("\n"))
    return 0


def with_fault(cmd, args, out) -> int:
    """--list-faults, or the command with --plant's fault in the backend under test."""
    from ladder.sides import faults, path_faults
    if args.list_faults:
        out(faults.describe())
        out(path_faults.describe_paths())
        return 0
    path = path_faults.PATH_FAULTS.get(args.plant)
    if path is not None:                # a bug in one plain path only (prefill_batch, body)
        why = path.not_in(args.backend, args.decode)
        if why:
            raise LadderInputError(f"--plant {args.plant}: not in backend {args.backend} "
                                   f"--decode {args.decode}: {why}")
        out(f"planted fault {path.name} in {path.path} only ({args.backend}): {path.what}")
        with path.plant():
            return cmd(args, out)
    fault = faults.FAULTS.get(args.plant)
    weights = args.weights or ("cq" if args.cact else "dense")
    if fault is None or fault.weights == "cq" != weights:     # layer-math faults fit both
        raise LadderInputError(f"--plant {args.plant}: " + (
            f"unknown; --list-faults names {len(faults.FAULTS)}" if fault is None else
            f"lives in {fault.weights} weights, this run uses --weights {weights}"))
    try:
        ctx = faults.planted(args.plant, args.backend)
    except faults.FaultError as e:
        raise LadderInputError(str(e)) from None
    out(f"planted fault {fault.name} in backend {args.backend}: {fault.what}")
    with ctx:
        return cmd(args, out)
