"""`python -m ladder run | locate | report | regen | rules`: the port beside the reference.

run     both sides over a seeded prompt and decode steps past the window; prints the
        tolerance table (per point, its worst step) and the first divergence.
        `--model attn_v41`: DeepSeek-V4.1 attention instead (ladder/v41_cli.py; run, locate
        and report alike).
locate  the same, then the first divergence scanned inside its layer (a linear scan in
        forward order), with local (injected) vs propagated error.
report  the same, written as markdown, CSV and a self-contained HTML page.
regen   (re)write the forward-parity fixture (tools/gen_v2_forward_parity.py calls this).
rules   print the default tolerance rules as TOML/JSON, a starting point for --rules.
points  print the registry: every point's name, shape and scope in forward order.
compare A [B]  any two ladders: trace archives, needle-rs fixtures, our fixtures, the live
        reference, our backends, an in-process --port (ladder/compare_cli.py).
dump    one side's ladder written as a trace archive (ladder/archive.py).
sweep   many runs over a TOML grid, sharded and resumable, one report (ladder/sweep.py).

Exit status: 0 every point passes, 1 divergence, 2 bad input (the message names it).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

from . import fixtures
from .args import check as check_args, check_model, schedule_note
from .capture import capture_port, capture_reference
from .compare import CompareError, compare_ladders
from .progress import bar
from .rules import COMPARED_SIDES, DEFAULT_RULES, RulesError, dump_rules, load_rules
from .runinfo import describe_port, graph_verdict
from .trace import TraceError

DEFAULT_PROMPT, DEFAULT_STEPS = 6, 12


class LadderInputError(ValueError):
    """A command-line value the ladder refuses (names the value and the limit)."""


def _input_errors() -> tuple:
    from port.model import StepError
    from port.state import StateError
    from reference.config import ConfigError
    from reference.decode import DecodeInputError
    from reference.params import ParamsError
    from reference.safe_io import InputFileError
    errs = [LadderInputError, ConfigError, ParamsError, DecodeInputError, StepError, InputFileError,
            StateError, RulesError, CompareError, fixtures.FixtureError, OSError]
    for mod, name in (("ladder.v41", "V41FixtureError"), ("port.v41.attn", "AttnV41Error"),
                      ("reference.v41.attn", "AttnV41Error")):
        try:
            errs.append(getattr(__import__(mod, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    for mod, name in (("reference.cact", "CactFormatError"), ("port.cq", "CqError"),
                      ("ladder.archive", "ArchiveError"), ("ladder.needle_rs", "NeedleRsError"),
                      ("ladder.namemap", "NameMapError"), ("ladder.geometry", "GeometryError"),
                      ("ladder.ports", "PortLoadError"), ("ladder.sweep_grid", "SweepError"),
                      ("ladder.judge", "JudgeError")):
        try:
            errs.append(getattr(__import__(mod, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errs)


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
                                               decode=args.decode), weights
        if not hasattr(V2Model, "from_cactfile"):
            raise LadderInputError(f"{where}: this port has no V2Model.from_cactfile")
        if cactfile is None:
            from reference.cact import build_cact
            cactfile = build_cact(params, cfg, args.bits_map)
        ref = {k: v.float() for k, v in cactfile.params.items()}
        return ref, V2Model.from_cactfile(cactfile, weights, args.device, args.backend,
                                               args.decode), weights
    except LadderInputError:
        raise
    except (ValueError, RuntimeError) as e:
        raise LadderInputError(f"{where}: {e}") from None


def _schedule(args, cfg):
    n = args.prompt_len + args.steps
    if args.prompt_len < 1:
        raise LadderInputError(f"--prompt-len {args.prompt_len} must be >= 1")
    if args.steps < 0:
        raise LadderInputError(f"--steps {args.steps} must be >= 0")
    if n > cfg.max_seq_len:
        raise LadderInputError(f"--prompt-len + --steps = {n} exceeds max_seq_len="
                               f"{cfg.max_seq_len}")
    return fixtures.seeded_tokens(cfg, n, args.seed), args.prompt_len


def compare_run(args, out=print):
    """Everything `run`, `locate` and `report` share: (comparison, ladders, model, info)."""
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
        tokens, prompt = _schedule(args, cfg)
        window = cfg.kv_window if args.window is None else args.window
    params, model, weights = build_port(params, cfg, cactfile, args)
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
    if args.fixture:                  # the fixture stands in for the reference: not run live
        out(f"reference: not run; fixture {fx.path} stands in ({fx.manifest['values']}, "
            f"written by {fx.manifest['generator']}, torch {fx.manifest['torch_version']})")
    check = not args.no_check_plain
    if args.fixture:
        # on a failure the fixture itself is held to the reference (ladder/stand_in.py)
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
    cmp = compare_ladders(port, ref, rules, prefix="port", a_label=run.label(),
                          b_label=ref.label)
    extra = []
    td = time.perf_counter()
    info = {"model": f"{src['source']} {src.get('preset', src.get('file', ''))}",
            **run.as_info(),
            "params sha256": src["sha256"][:16], "seed": args.seed,
            "schedule": f"prompt {prompt} + {n - prompt} steps, window {window}",
            "rules": rules.source, "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "timing": ("reference not run (fixture)" if args.fixture else
                       f"reference {tb - ta:.2f} s") + f", port {tc - tb:.2f} s, compare "
                      f"{td - tc:.2f} s, total {td - t0:.2f} s"}
    return cmp, extra, port, ref, model, port_window, info


def _print_table(cmp, args, out):
    from .table import summary, to_text
    df = cmp.to_frame()
    # The coarse view never hides a failure: a failing point is shown wherever it lies.
    failing = set(df.loc[~df["passed"], "point"])
    if args.per_step:
        shown = df if args.fine else df[df["coarse"] | ~df["passed"]]
    else:
        shown = summary(df if args.fine else df[df["coarse"] | df["point"].isin(failing)])
    out("")
    out(to_text(shown))
    if not args.fine:
        extra = len(failing - set(df.loc[df["coarse"], "point"]))
        unit, left = (("rows", len(df) - len(shown)) if args.per_step else
                      ("points", df["point"].nunique() - shown["point"].nunique()))
        out(f"(coarse ladder" + (f" + {extra} failing point{'s' * (extra != 1)} off it"
                                 if extra else "") +
            f"; {left} of {len(df) if args.per_step else df['point'].nunique()} {unit} not "
            f"shown, all passing: --fine shows them, --per-step every step)")


def _other_model(args) -> bool:
    """True for --model attn_v41 (issue #8): its ladder lives in ladder/v41.py."""
    return getattr(args, "model", "needle_v2") == "attn_v41"


def cmd_run(args, out=print) -> int:
    if getattr(args, "port", None) or getattr(args, "dump", None):
        from .compare_cli import run_protocol_port
        return run_protocol_port(args, out, "run")
    if _other_model(args):
        from .v41_cli import cmd_run as v41_run
        return v41_run(args, out)
    cmp, extra, port, ref, *_, info = compare_run(args, out)
    _print_table(cmp, args, out)
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
    from .stand_in import check_stand_in
    si = check_stand_in(stored, port, args.recompute_reference(),
                        args.compare_rules, f"fixture {args.fixture}",
                        f"python -m ladder regen --out {args.fixture}")
    if not si.stale:
        return False
    out("")
    out(si.message())
    return True


def cmd_locate(args, out=print) -> int:
    if getattr(args, "port", None) or getattr(args, "dump", None):
        from .compare_cli import run_protocol_port
        return run_protocol_port(args, out, "locate")
    if _other_model(args):
        from .v41_cli import cmd_locate as v41_locate
        return v41_locate(args, out)
    from .locate import locate
    cmp, extra, port, ref, model, window, info = compare_run(args, out)
    out("")
    out(str(cmp))
    if not cmp.passed and _stale_fixture(args, port, ref, out):
        return 1
    loc = locate(cmp, port=port, ref=ref, model=model, window=window)
    out("")
    out(str(loc) if loc is not None else "no divergence: every point passes its rule")
    bad = [c for c in extra if not c.passed]
    for c in bad:
        out(str(c))
    return 0 if loc is None and not bad else 1


def cmd_report(args, out=print) -> int:
    if getattr(args, "port", None) or getattr(args, "dump", None):
        from .compare_cli import run_protocol_port
        return run_protocol_port(args, out, "report")
    if _other_model(args):
        from .v41_cli import cmd_report as v41_report
        return v41_report(args, out)
    from .locate import locate
    from .plot import fallback_note
    from .report import write_report
    cmp, extra, port, ref, model, window, info = compare_run(args, out)
    loc = locate(cmp, port=port, ref=ref, model=model, window=window)
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
    tokens, prompt = _schedule(args, cfg)
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
        from .rules import V41_SIDES
        rs = load_rules(args.rules, V41_SIDES if args.model == "attn_v41" else COMPARED_SIDES)
    elif args.model == "attn_v41":
        from .rules import V41_RULESET
        rs = V41_RULESET
    else:
        rs = DEFAULT_RULES
    out(dump_rules(rs, args.format).rstrip("\n"))
    return 0


def _model_args(p, regen=False):
    p.add_argument("--preset", default="tiny", choices=["tiny", "shipped"])
    p.add_argument("--params", help="safetensors parameter file (config in its metadata)")
    p.add_argument("--cact", help=".cact checkpoint: the port computes from its packed CQ codes "
                                  "(--weights cq, the default here), the reference from the "
                                  "exactly dequantised float32 weights")
    p.add_argument("--seed", type=int, default=0, help="parameter init and token seed")
    p.add_argument("--prompt-len", type=int, default=DEFAULT_PROMPT)
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="one-token decode steps")
    p.add_argument("--window", type=int, default=None, help="attention window (default: config)")
    _memory_arg(p)
    if regen:
        return
    p.add_argument("--model", default="needle_v2", choices=["needle_v2", "attn_v41"],
                   help="needle_v2 (default) or attn_v41: DeepSeek-V4.1 attention, reference vs "
                        "the official fixture and port vs reference (run also checks graph vs "
                        "eager on every capturable layer-step). --fixture, --backend "
                        "torch|triton, --device, --rules, --per-step apply; any other "
                        "model option is refused (ladder/v41_cli.py)")
    p.add_argument("--rules", help="tolerance rules file (.toml or .json; see `ladder rules`)")
    p.add_argument("--weights", default=None,
                   help="port weight form: dense (float32) or cq (Cactus-Quants codes; the "
                        "reference then runs on the dequantised weights). Default: cq for "
                        "--cact, else dense")
    p.add_argument("--bits-map", default="embedding=4,mhc=4,default=2",
                   help="CQ widths when --weights cq quantises --params/--preset weights")
    p.add_argument("--device", default="cpu", help="port device (the reference runs on CPU)")
    p.add_argument("--backend", default="torch", choices=["torch", "triton", "native"],
                   help="the port's kernels: torch ops with the torch attention twin, Triton "
                        "attention (the interpreter on CPU: slow, for the tiny model), or the "
                        "native C step (CPU; with --weights cq it reads the packed codes)")
    p.add_argument("--decode", default="eager", choices=["eager", "graph"],
                   help="the port's step: eager, or host prep + the capturable device body "
                        "(a CUDA graph on CUDA); the run checks it against the traced eager "
                        "step bit for bit")
    p.add_argument("--fixture", help="compare against this fixture stem instead of running the "
                                     "reference live (its tokens and schedule win; only a "
                                     "fixture of the reference's values, from regen)")
    p.add_argument("--no-check-plain", action="store_true",
                   help="skip proving that tracing changes no bit (saves a third run)")
    p.add_argument("--fine", action="store_true", help="print every point, not the coarse ladder")
    p.add_argument("--per-step", action="store_true", help="print one row per (step, point)")
    p.add_argument("--plant", metavar="FAULT", help="run the port with a known bug planted in "
                   "the backend's own code (ladder/faults.py; demo: the run must exit 1)")
    p.add_argument("--list-faults", action="store_true", help="list the plantable faults")
    p.add_argument("--port", default=None, metavar="MODULE:FACTORY",
                   help="compare an in-process port of the protocol (ladder/ports.py) instead "
                        "of port.V2Model; locate re-runs the reference's layer from its inputs")
    p.add_argument("--dump", default=None, metavar="FILE",
                   help="the port side is this recording (a trace archive or a needle-rs "
                        "fixture): run, locate and report judge it as `compare FILE` does")


def _memory_arg(p):
    from reference.memory_budget import DEFAULT_MAX_MEMORY, cli_size
    p.add_argument("--max-memory", type=cli_size, default=None, metavar="SIZE",
                   help=f"budget for the tables a geometry implies (parameters, RoPE, KV and "
                        f"Engram rings), e.g. 4G; files needing more are refused before "
                        f"anything is allocated (default {DEFAULT_MAX_MEMORY >> 30}G)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m ladder", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, helptext in (("run", "port beside reference: tolerance table, first divergence"),
                           ("locate", "scan the first divergence's layer (linear, forward order); local vs "
                            "propagated error"),
                           ("report", "write markdown, CSV and HTML reports")):
        p = sub.add_parser(name, help=helptext)
        _model_args(p)
        if name == "report":
            p.add_argument("--out", default="ladder-report", help="output directory")
            p.add_argument("--stem", default="ladder", help="file name stem")
            p.add_argument("--plot", default="auto", choices=["auto", "svg", "png"],
                           help="figure format (auto: PNG via matplotlib if installed)")
    p = sub.add_parser("regen", help="regenerate the forward-parity fixture")
    _model_args(p, regen=True)
    p.add_argument("--out", default=None,
                   help="fixture path stem (default: the checkout's "
                        "tests/fixtures/v2_forward_vectors, whatever the working directory)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 unless the existing files regenerate byte for byte")
    p.add_argument("--force", action="store_true",
                   help="overwrite the committed default fixture even from other inputs (any "
                        "model or schedule flag off its default)")
    p.add_argument("--format", default="needle-parity", choices=["needle-parity", "needle-rs"],
                   help="needle-parity: our fixture (safetensors + JSON); needle-rs: its "
                        "STEM.json + STEM.f32 of greedy decode steps, which needle-rs's "
                        "v2_forward_parity test reads unchanged")
    p.add_argument("--prompt", default=None, help="--format needle-rs: prompt text, encoded "
                   "with the checkpoint's tokenizer after BOS (default: seeded token ids)")
    for name, helptext in (("compare", "compare any two ladders (files, reference, backends)"),
                           ("dump", "write one side's ladder as a trace archive")):
        p = sub.add_parser(name, help=helptext)
        if name == "compare":
            p.add_argument("a", help="candidate: archive, needle-rs stem, fixture stem, "
                                     "reference, torch, native, triton or port")
            p.add_argument("b", nargs="?", default=None, help="yardstick (default reference)")
            p.add_argument("--map", default=None, help="name map for foreign files: needle-rs, "
                           "upstream-jax or a TOML file (ladder/namemap.py)")
            p.add_argument("--locate", action="store_true", help="on a divergence, re-run the "
                           "reference's layer from the candidate's recorded inputs")
            p.add_argument("--report", default=None, metavar="DIR", help="also write the "
                           "markdown, CSV and HTML report there")
            p.add_argument("--stem", default="compare", help="report file name stem")
            p.add_argument("--fine", action="store_true")
            p.add_argument("--per-step", action="store_true")
        else:
            p.add_argument("side", choices=["reference", "torch", "native", "triton", "port",
                                            "native-exe", "official"],
                           help="native-exe: the C step as a standalone program "
                                "(kernels/native/needle_trace.c) writes the archive itself")
            p.add_argument("--plant", metavar="FAULT", default=None,
                           help="native-exe: build the program with this C fault switch")
            p.add_argument("--out", required=True, help="the archive's path (.safetensors)")
            p.add_argument("--last-only", action="store_true",
                           help="keep each step's last position only")
        _model_args(p, regen=True)
        p.add_argument("--rules", help="tolerance rules file (.toml or .json)")
        p.add_argument("--weights", default=None, choices=[None, "dense", "cq"])
        p.add_argument("--bits-map", default="embedding=4,mhc=4,default=2")
        p.add_argument("--device", default="cpu")
        p.add_argument("--backend", default="torch", choices=["torch", "triton", "native"],
                       help=argparse.SUPPRESS)
        p.add_argument("--decode", default="eager", choices=["eager", "graph"])
        p.add_argument("--port", default=None, metavar="MODULE:FACTORY",
                       help="an in-process port (ladder/ports.py): side 'port'")
        p.add_argument("--no-check-plain", action="store_true")
        p.add_argument("--model", default="needle_v2", choices=["needle_v2", "attn_v41"],
                       help="attn_v41: the V4.1 attention's ladder over its fixture's calls "
                            "(sides: an archive, official, reference, torch, triton)")
        p.add_argument("--fixture", default=None, help="attn_v41: the fixture stem (default "
                       "the committed one)")
    p = sub.add_parser("rules", help="print the tolerance rules (default or --rules FILE)")
    p.add_argument("--rules")
    p.add_argument("--format", default="toml", choices=["toml", "json"])
    p.add_argument("--model", default="needle_v2", choices=["needle_v2", "attn_v41"],
                   help="whose default rules to print (attn_v41: V41_RULES)")
    from .points_cli import add_parser as add_points_parser
    add_points_parser(sub)
    from .sweep import add_parser as add_sweep_parser
    add_sweep_parser(sub)
    return ap


def _with_fault(cmd, args, out) -> int:
    """--list-faults, or the command with --plant's fault in the backend under test."""
    from . import faults
    if args.list_faults:
        out(faults.describe())
        out(faults.describe_paths())
        return 0
    path = faults.PATH_FAULTS.get(args.plant)
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


def _cmd_sweep(args, out=print) -> int:
    from .sweep import cmd_sweep
    return cmd_sweep(args, out)


def _cmd_points(args, out=print) -> int:
    from .points_cli import cmd_points
    return cmd_points(args, out)


def main(argv=None, out=print) -> int:
    from .safe_print import safe_print
    out = safe_print if out is print else out       # file text: escaped, never a crash
    args = parser().parse_args(argv)
    from . import compare_cli
    cmd = {"run": cmd_run, "locate": cmd_locate, "report": cmd_report, "regen": cmd_regen,
           "rules": cmd_rules, "compare": compare_cli.cmd_compare,
           "dump": compare_cli.cmd_dump, "sweep": _cmd_sweep, "points": _cmd_points}[args.cmd]
    if args.cmd in ("compare", "dump") and args.model == "attn_v41":
        from . import v41_archive
        cmd = {"compare": v41_archive.cmd_compare, "dump": v41_archive.cmd_dump}[args.cmd]
    if args.cmd == "regen" and args.format == "needle-rs":
        cmd = compare_cli.cmd_regen_needle_rs
        if args.out is None:
            args.out = "v2_forward_vectors"
    try:
        if _other_model(args) and args.cmd not in ("compare", "dump"):
            # refuse the options a V4.1 run would silently ignore
            from .v41_cli import refuse_other_options
            refuse_other_options(args, sys.argv[1:] if argv is None else argv,
                                 parser().parse_args([args.cmd]))
        check_args(args)                    # every flag, before any work (ladder/args.py)
        if args.cmd != "dump" and (getattr(args, "list_faults", False)
                                   or getattr(args, "plant", None)):
            return _with_fault(cmd, args, out)
        return cmd(args, out)
    except TraceError as e:
        safe_print(f"divergence: {e}", file=sys.stderr)
        return 1
    except _input_errors() as e:
        safe_print(f"error: {e}", file=sys.stderr)
        return 2
