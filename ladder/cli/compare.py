"""`python -m ladder compare A [B]`, `dump SIDE`, and `regen --format needle-rs`.

A side is a trace archive (`.safetensors` written by `dump` or any port), a needle-rs fixture
(`STEM.json` + `STEM.f32`), our forward-parity fixture (`STEM.json` + `STEM.safetensors`), a
safetensors file in another implementation's names read through `--map`, `reference` (run
live on the model of --params/--cact/--preset, on the tokens the other side recorded), one of
our backends (`torch`, `native`, `triton`), or `port` (the in-process port of --port). A is the
candidate, B (default `reference`) the yardstick whose magnitudes scale the bounds.
"""
from __future__ import annotations

import dataclasses
import os
import time

from ladder.cli.show import print_table
from ladder.engine.trace import Ladder
from ladder.sides.model_input import LadderInputError, build_port, load_model, schedule_tokens
from ladder.sides.side_spec import (LIVE, check_agree, check_recorded_argmax, check_registry,
                                    file_sha256, geometry_dict, load_side, project_version,
                                    schedule_of, side_notes)


def _err(msg):
    return LadderInputError(msg)


def run_live(spec, args, params, cfg, cactfile, tokens, prompt, window, progress=None):
    """(ladder, description) of a live side on these tokens."""
    from ladder.sides.capture import capture_port, capture_reference
    check = not args.no_check_plain
    if spec == "reference":
        lad = capture_reference(params, cfg, tokens, prompt, window=window, check_plain=check,
                                progress=progress, label="reference")
        return lad, params, "reference (float32)"
    if spec == "port":
        if not args.port:
            raise _err("compare: side 'port' needs --port module:factory")
        from ladder.sides import ports
        timeout = getattr(args, "port_timeout", None)
        # the schedule's window reaches the factory as cfg.kv_window (the protocol's one way
        # to tell a port its window: README "Bring your own port")
        port_cfg = cfg if window == cfg.kv_window else dataclasses.replace(cfg,
                                                                           kv_window=window)
        port = ports.build_port(args.port, params, port_cfg, timeout=timeout)
        state_window = getattr(ports.guarded_call(f"--port {args.port}: make_state()",
                                                  port.make_state, timeout=timeout),
                               "window", None)
        if state_window is None and window != cfg.kv_window:
            raise _err(f"compare: window {window} (the model's is {cfg.kv_window}): --port "
                       f"{args.port}'s make_state() has no `window` attribute, so whether its "
                       f"factory took cfg.kv_window={window} cannot be checked; give the state "
                       f"a `window`, or drop --window")
        if state_window is not None and state_window != window:
            raise _err(f"compare: --port {args.port} steps on a window of {state_window}; the "
                       f"schedule's is {window} (its factory got cfg.kv_window={window}: build "
                       f"the state's window from it)")
        return ports.capture_protocol(port, cfg, tokens, prompt, check_plain=check,
                                      progress=progress, label=f"port {args.port}",
                                      timeout=timeout), params, args.port
    if spec == "native-exe":
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.safetensors")
            run_native_exe(args, params, cfg, tokens, prompt, window, path)
            lad = load_archive_file(path, args.max_memory)
        if progress is not None:
            progress.update(len(tokens))
        return lad, params, "needle_trace (the C step as a program)"
    from ladder.sides.runinfo import describe_port
    args.backend = spec
    ref_params, model, weights = build_port(params, cfg, cactfile, args)
    override = None if model.make_state().window == window else window
    run = describe_port(model, weights, args.device, override)
    lad = capture_port(model, tokens, prompt, window=override, check_plain=check,
                       progress=progress, label=run.label())
    return lad, ref_params, run.label()


def cmd_compare(args, out=print) -> int:
    from ladder.engine.compare import compare_ladders
    from ladder.cli.progress import bar
    from ladder.engine.rules import DEFAULT_RULES, load_rules
    rules = load_rules(args.rules) if args.rules else DEFAULT_RULES
    specs = [args.a, args.b or "reference"]
    files = [None if s in LIVE else load_side(s, args) for s in specs]
    live = [s for s, f in zip(specs, files) if f is None]
    params = cfg = src = cactfile = None
    declared = files[0].meta.get("precision") if files[0] is not None else None
    low = getattr(args, "port_precision", None) or (declared is not None
                                                      and not declared.is_float32)
    if live or args.locate or low:
        params, cfg, src, cactfile = load_model(args)
        for flag in ("cact", "params"):
            if getattr(args, flag):
                src["file_sha256"] = file_sha256(getattr(args, flag))
    identity = check_agree(list(zip(specs, files)), cfg, src)
    base = next((f for f in files if f is not None), None)
    if base is not None:
        tokens, prompt = schedule_of(base)
        window = base.meta.get("kv_window")
        if window is None:
            window = cfg.kv_window if cfg is not None else 0
        if cfg is not None and len(tokens) > cfg.max_seq_len:
            raise _err(f"compare: {len(tokens)} positions recorded, more than the model's "
                       f"max_seq_len={cfg.max_seq_len}")
    else:
        from ladder.cli.args import check_model
        check_model(args, cfg)          # --window and the schedule against the geometry
        tokens, prompt = schedule_tokens(args, cfg)
        window = cfg.kv_window if args.window is None else args.window
    ladders, labels, ref_params = [], [], params
    with bar(len(tokens) * len(live), "capturing") as pb:
        for spec, f in zip(specs, files):
            if f is not None:
                ladders.append(f)
                labels.append(f"{spec} ({f.label})")
                continue
            lad, rp, label = run_live(spec, args, params, cfg, cactfile, tokens, prompt, window,
                                      pb)
            if spec == "reference" or ref_params is params:
                ref_params = rp
            ladders.append(lad)
            labels.append(label)
    a, b = ladders
    out(f"needle-parity {getattr(args, 'via', None) or 'compare'}: {labels[0]} vs {labels[1]}")
    last = "last" in (a.captured, b.captured)
    out(f"schedule: prompt {prompt} + {len(tokens) - prompt} decode steps = {len(tokens)} "
        f"positions, window {window}" + (f"; compared: {len(a.steps)} last positions of "
                                         f"{len(tokens)} (the last of each step)" if last else ""))
    for line in identity:
        out(line)
    for label, lad in zip(labels, (a, b)):
        for line in side_notes(label, lad):
            out(line)
    if cfg is not None:
        from ladder.formats.foreign import fill_not_emitted
        for lad in (a, b):
            fill_not_emitted(lad, cfg)
        check_registry([(labels[0], a), (labels[1], b)], cfg)
    # Every row only where they are all shown or written; else the folded summary, so a long
    # comparison's memory stays one step of each side (README "Bring your own port").
    keep = "all" if args.per_step or args.report else "summary"
    floor, prec = None, _precision(args, a)
    declared_b = b.meta.get("precision")
    if prec is not None and declared_b is not None and not declared_b.is_float32:
        raise _err(f"compare: the yardstick {labels[1]} declares {declared_b.short()}; a "
                   f"candidate at {prec.short()} is judged against a float32 yardstick (the "
                   f"reference, or a recording of it)")
    if prec is not None and getattr(args, "port_precision", None) and \
            a.meta.get("precision") not in (None, prec):
        out(f"precision: --port-precision {prec.text()} overrides what {labels[0]} declares "
            f"({a.meta['precision'].text()})")
    if prec is not None:
        from ladder.sides.noise_floor import capture_floor
        if not args.rules:
            from ladder.engine.rules import NOISE_RULES
            rules = NOISE_RULES
        t0 = time.perf_counter()
        floor = capture_floor(ref_params, cfg, tokens, prompt, prec, window=window)
        out(f"noise floor: the reference re-run at {prec.short()} ({prec.text()}, "
            f"{'--port-precision' if getattr(args, 'port_precision', None) else 'declared by ' + labels[0]}; "
            f"docs/precision.md), {time.perf_counter() - t0:.2f} s; rules {rules.source}")
    from ladder.engine.rules import UNIT_EPS
    own = None
    # each op re-run on the candidate's inputs, when the yardstick is the reference itself
    if cfg is not None and ref_params is not None and specs[1] == "reference":
        from ladder.sides.own_error import own_sums
        own = own_sums(a, ref_params, cfg, prec, window)
    cmp = compare_ladders(a, b, rules, prefix="port", a_label=labels[0], b_label=labels[1],
                          keep=keep, floor=floor,
                          unit_eps=UNIT_EPS[prec.activations if prec else "float32"],
                          precision=prec, own=own)
    cmp.precision = prec
    check_recorded_argmax(cmp, a, b, labels)
    print_table(cmp, args, out)
    out("")
    out(str(cmp))
    loc = None
    if not cmp.passed:
        if args.locate and cfg is not None:
            from ladder.sides.dump_locate import locate_dump
            full_ref = b if specs[1] == "reference" else run_live(
                "reference", args, ref_params, cfg, None, tokens, prompt, window)[0]
            loc = locate_dump(cmp, a, full_ref, ref_params, cfg, window, floor=floor,
                              precision=prec)
            out("")
            out(str(loc))
        else:
            out(_locate_hint(args))
    if args.report:
        from ladder.engine.report import write_report
        paths = write_report(cmp, args.report, loc, {"candidate": labels[0],
                                                     "yardstick": labels[1]},
                             stem=args.stem, plot_backend=getattr(args, "plot", "svg"))
        for ext, p in paths.items():
            out(f"wrote {p} ({os.path.getsize(p)} bytes)")
    return 0 if cmp.passed else 1


def _precision(args, candidate):
    """The candidate's precision when below float32 (--port-precision, else what the side
    declares: an archive's producer.precision, a port's attribute), else None."""
    from ladder.model.precision import Precision
    spec = getattr(args, "port_precision", None)
    prec = Precision.parse(spec) if spec else candidate.meta.get("precision")
    return None if prec is None or prec.is_float32 else prec


def cmd_dump(args, out=print) -> int:
    from ladder.cli.progress import bar
    params, cfg, src, cactfile = load_model(args)
    file = args.cact or args.params
    tokens, prompt = schedule_tokens(args, cfg)
    window = cfg.kv_window if args.window is None else args.window
    if args.plant and args.side != "native-exe":
        raise _err(f"dump --plant {args.plant}: only for native-exe (`run --plant` plants a "
                   f"fault in any backend)")
    if args.side == "native-exe" and not args.last_only:   # the program writes it itself
        run_native_exe(args, params, cfg, tokens, prompt, window, args.out)
        out(f"dump: needle_trace (the C step as a program{', planted ' + args.plant if args.plant else ''}) "
            f"over {len(tokens)} positions")
        out(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")
        return 0
    with bar(len(tokens), f"dump {args.side}") as pb:
        lad, ref_params, label = run_live(args.side, args, params, cfg, cactfile, tokens,
                                          prompt, window, pb)
    if args.last_only:
        lad = lad.last_only()
    from ladder.sides.fixtures import params_sha256
    producer = {"name": "needle-parity " + ("reference" if args.side == "reference" else
                                            "port" if args.side == "port" else "port.V2Model"),
                "version": project_version(), "backend": "" if args.side == "reference" else
                (args.port if args.side == "port" else args.side),
                "device": "cpu" if args.side in ("reference", "port") else args.device,
                "dtype": "float32"}
    if lad.meta.get("precision") is not None:      # what the live port computed in
        producer["precision"] = lad.meta["precision"]
        producer["dtype"] = lad.meta["precision"].activations
    weights = {"source": src["source"], "file": os.path.basename(file) if file else
               src.get("preset", ""), "sha256": file_sha256(file) if file else None,
               "params_sha256": params_sha256(ref_params)}
    path = lad.save(args.out, producer=producer, geometry=geometry_dict(cfg), kv_window=window,
                    weights=weights, prompt_len=prompt)
    out(f"dump: {label} over {len(tokens)} positions ({lad.captured} positions of each step), "
        f"{len(lad)} values, {len(lad.hidden)} not emitted")
    out(f"wrote {path} ({os.path.getsize(path)} bytes)")
    return 0


def cmd_regen_needle_rs(args, out=print) -> int:
    """`regen --format needle-rs`: greedy decode on the reference, written as needle-rs's
    fixture (its test reads it unchanged)."""
    from ladder.formats import needle_rs
    from ladder.cli.progress import bar
    from ladder.sides import needle_rs_regen
    params, cfg, src, cactfile = load_model(args)
    tok = getattr(cactfile, "tokenizer", None)
    if args.prompt is not None:
        if tok is None:
            raise _err("regen --prompt: the model carries no tokenizer (give --cact with one, "
                       "or drop --prompt for seeded token ids)")
        prompt_ids = [tok.bos_id] + tok.encode(args.prompt)
    else:
        prompt_ids = schedule_tokens(args, cfg)[0][:args.prompt_len]
    if len(prompt_ids) + args.steps > cfg.max_seq_len:
        raise _err(f"regen: prompt of {len(prompt_ids)} tokens + --steps {args.steps} exceeds "
                   f"max_seq_len={cfg.max_seq_len}")
    bad = [t for t in prompt_ids if not 0 <= t < cfg.vocab_size]
    if bad:
        raise _err(f"regen --prompt: token id {bad[0]} outside the model's vocab_size "
                   f"{cfg.vocab_size}")
    with bar(len(prompt_ids) + args.steps, "reference f64") as pb:
        lad, gen = needle_rs_regen.build(params, cfg, prompt_ids, args.steps,
                                         window=args.window, eos_id=tok.eos_id if tok is not None else None, progress=pb)
    source = os.path.basename(args.cact or args.params or f"preset:{args.preset}")
    kw = dict(cfg=cfg, kv_window=cfg.kv_window if args.window is None else args.window,
              source=source, prompt=args.prompt or "", generated_ids=gen,
              generated_text=tok.decode(gen) if tok is not None else "",
              max_len=min(cfg.max_seq_len, len(prompt_ids) + args.steps + 1))
    if args.check:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            new = needle_rs.write(os.path.join(tmp, "fx"), lad, **kw)
            diff = [ext for n, ext in zip(new, (".json", ".f32"))
                    if not _same(n, args.out + ext)]
        out(f"{args.out}.json/.f32: " + ("byte-identical to a fresh regeneration" if not diff
                                        else f"{', '.join(diff)} DIFFER from a fresh "
                                             f"regeneration"))
        return 1 if diff else 0
    for p in needle_rs.write(args.out, lad, **kw):
        out(f"wrote {p} ({os.path.getsize(p)} bytes)")
    out(f"needle-rs fixture: prompt {len(prompt_ids)} tokens, {len(gen)} greedy decode steps, "
        f"generated {gen[:8]}{'...' if len(gen) > 8 else ''}")
    return 0


def _same(a, b) -> bool:
    if not os.path.isfile(b):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def _locate_hint(args) -> str:
    """The command that splits a divergence, as the user can type it: `run --port/--dump` has
    no --locate flag, its sibling command `locate` takes the same options."""
    via = getattr(args, "via", "compare")
    if via == "compare":
        return ("divergence: add --locate (with the model's --params/--cact/--preset) to split "
                "the layer's own error from what it inherited")
    return (f"divergence: `python -m ladder locate` with the same options as this `{via}` "
            f"splits the layer's own error from what it inherited")


def run_protocol_port(args, out, cmd: str) -> int:
    """`run|locate|report --port M:F` or `--dump FILE`: that port (or recording) beside the
    reference (or --fixture) through `compare`, locating by re-running the reference's layer
    from the port's own inputs."""
    if args.port and args.dump:
        raise _err(f"--port {args.port} and --dump {args.dump}: give one of them")
    what = f"--port {args.port}" if args.port else f"--dump {args.dump}"
    for flag in ("plant", "list_faults"):
        if getattr(args, flag, None):
            raise _err(f"--{flag.replace('_', '-')} plants faults in our backends; it does not "
                       f"apply to {what}")
    args.a, args.b, args.map = args.dump or "port", args.fixture or "reference", None
    args.locate = cmd in ("locate", "report")
    args.via = cmd
    args.report = args.out if cmd == "report" else None
    if cmd != "report":
        args.stem = "compare"
    return cmd_compare(args, out)


def load_archive_file(path, budget):
    return Ladder.load(path, budget)


def run_native_exe(args, params, cfg, tokens, prompt, window, out_path) -> str:
    """The C step as a standalone program: write its image (port/native_image.py), run
    `needle_trace IMAGE OUT` (built with --plant's C switch, if any) in its own process."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        image = os.path.join(tmp, "image.safetensors")
        exe = native_exe_image(args, params, cfg, tokens, prompt, window, image)
        res = subprocess.run([exe, image, os.fspath(out_path)], capture_output=True, text=True,
                             timeout=600)
    if res.returncode != 0:
        raise _err(f"needle_trace exited {res.returncode}: {res.stderr.strip()[-500:]}")
    return out_path


def native_exe_image(args, params, cfg, tokens, prompt, window, image_path) -> str:
    """Write needle_trace's image for this run to `image_path`; the program's path."""
    from kernels import native
    from port.model import V2Model
    from port.native_image import write_image
    from ladder.engine.archive import manifest_for
    from ladder.sides.fixtures import params_sha256
    from ladder.model.points import expected
    from ladder.engine.trace import schedule
    if (args.weights or "dense") != "dense" or args.cact:
        raise _err("native-exe computes on dense float32 weights: give --params or --preset "
                   "(not --cact / --weights cq)")
    defines = ()
    if getattr(args, "plant", None):
        from ladder.sides.faults import FAULTS
        fault = FAULTS.get(args.plant)
        if fault is None or not fault.native.startswith("NEEDLE_FAULT_"):
            raise _err(f"--plant {args.plant}: native-exe plants only the C step's switches "
                       f"({', '.join(sorted(n for n, f in FAULTS.items() if f.native.startswith('NEEDLE_FAULT_')))})")
        defines = (fault.native,)
    model = V2Model.from_params(params, cfg)
    if model.make_state().window != window:
        raise _err(f"native-exe steps on make_state()'s window {model.make_state().window}; "
                   f"the schedule's is {window}")
    steps = schedule(tokens, prompt)
    file = args.cact or args.params
    manifest = manifest_for(
        Ladder(steps), producer={"name": "needle_trace", "version": project_version(),
                                 "backend": "native C program", "device": "cpu",
                                 "dtype": "float32"},
        geometry=geometry_dict(cfg), kv_window=window,
        weights={"source": "params" if file else "init", "file": os.path.basename(file or ""),
                 "sha256": file_sha256(file) if file else None,
                 "params_sha256": params_sha256(params)},
        prompt_len=prompt, points=[n for n, _ in expected(cfg)])
    exe = native.build(defines, program=True)
    write_image(model, list(tokens), [(s.pos, len(s.tokens)) for s in steps], image_path,
                manifest)
    return exe
