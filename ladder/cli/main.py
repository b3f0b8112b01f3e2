"""`python -m ladder COMMAND`: the dispatch to every command (the parser: ladder/cli/parser.py).

run     both sides over a seeded prompt and decode steps past the window; prints the
        tolerance table (per point, its worst step) and the first divergence.
        `--model attn_v41`: DeepSeek-V4.1 attention instead (ladder/v41/cli.py; run, locate
        and report alike).
locate  the same, then the first divergence scanned inside its layer (a linear scan in
        forward order), with local (injected) vs propagated error.
report  the same, written as markdown, CSV and a self-contained HTML page.
shrink  the first divergence shrunk to its smallest reproducer, written as a pytest file
        (ladder/cli/shrink.py, ladder/engine/shrink.py).
regen   (re)write the forward-parity fixture (tools/fixtures/gen_v2_forward_parity.py calls this).
rules   print the default tolerance rules as TOML/JSON, a starting point for --rules.
points  print the registry: every point's name, shape and scope in forward order.
compare A [B]  any two ladders: trace archives, needle-rs fixtures, our fixtures, the live
        reference, our backends, an in-process --port (ladder/cli/compare.py).
dump    one side's ladder written as a trace archive (ladder/engine/archive.py).
sweep   many runs over a TOML grid, sharded and resumable, one report (ladder/sweep/command.py).

Exit status: 0 every point passes, 1 divergence, 2 bad input (the message names it).
"""
from __future__ import annotations

import contextlib
import sys

from ladder.cli.parser import build_parser
from ladder.sides.defaults import DEFAULT_PROMPT, DEFAULT_STEPS  # noqa: F401  (re-exported)

# Everything else is imported where it is used: `--help` and a flag argparse refuses exit
# before any command runs, and must not pay for torch (~3 s on the 2-core machine).


def __getattr__(name):
    """The names this module re-exported before its imports moved into main()."""
    if name == "LadderInputError":
        from ladder.sides.model_input import LadderInputError
        return LadderInputError
    if name == "TraceError":
        from ladder.engine.trace import TraceError
        return TraceError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def parser():
    """`python -m ladder`'s parser, sweep included."""
    from ladder.sweep.command import add_parser as add_sweep_parser
    return build_parser((add_sweep_parser,))


def check_command(args) -> None:
    """Every flag of the parsed command that can be judged before any work."""
    if args.cmd == "sweep":                 # its cases get check_args each (ladder/sweep/)
        from ladder.sweep.command import check_flags as check_sweep_flags
        check_sweep_flags(args)
    else:
        from ladder.cli.args import check as check_args
        check_args(args)                    # ladder/cli/args.py


def _cmd_sweep(args, out=print) -> int:
    from ladder.sweep.command import cmd_sweep
    return cmd_sweep(args, out)


def _cmd_shrink(args, out=print) -> int:
    from ladder.cli.shrink import cmd_shrink
    return cmd_shrink(args, out)


def _cmd_points(args, out=print) -> int:
    from ladder.cli.points import cmd_points
    return cmd_points(args, out)


def main(argv=None, out=print) -> int:
    from ladder.engine.safe_print import safe_print
    out = safe_print if out is print else out       # file text: escaped, never a crash
    args = parser().parse_args(argv)
    from ladder.cli import compare as compare_cli
    from ladder.cli.commands import (cmd_locate, cmd_regen, cmd_report, cmd_rules, cmd_run,
                                     other_model, with_fault)
    from ladder.cli.errors import input_errors
    from ladder.engine.trace import TraceError
    cmd = {"run": cmd_run, "locate": cmd_locate, "report": cmd_report, "regen": cmd_regen,
           "rules": cmd_rules, "compare": compare_cli.cmd_compare,
           "dump": compare_cli.cmd_dump, "sweep": _cmd_sweep, "points": _cmd_points,
           "shrink": _cmd_shrink}[args.cmd]
    if args.cmd in ("compare", "dump") and args.model == "attn_v41":
        from ladder.v41 import archive as v41_archive
        cmd = {"compare": v41_archive.cmd_compare, "dump": v41_archive.cmd_dump}[args.cmd]
    if args.cmd == "regen" and args.format == "needle-rs":
        cmd = compare_cli.cmd_regen_needle_rs
        if args.out is None:
            args.out = "v2_forward_vectors"
    try:
        if other_model(args) and args.cmd not in ("compare", "dump"):
            # refuse the options a V4.1 run would silently ignore
            from ladder.v41.cli import refuse_other_options
            refuse_other_options(args, sys.argv[1:] if argv is None else argv,
                                 parser().parse_args([args.cmd]))
        check_command(args)                 # every flag, before any work
        from ladder.sides.model_input import computing
        # a sweep picks the mode case by case (ladder/sweep/row.py), in every process alike,
        # and `shrink --from-sweep` once it has read the case's flags (ladder/cli/shrink.py)
        own_mode = args.cmd == "sweep" or getattr(args, "from_sweep", None)
        with contextlib.nullcontext() if own_mode else computing(args):
            if args.cmd != "dump" and (getattr(args, "list_faults", False)
                                       or getattr(args, "plant", None)):
                return with_fault(cmd, args, out)
            return cmd(args, out)
    except TraceError as e:
        safe_print(f"divergence: {e}", file=sys.stderr)
        return 1
    except input_errors() as e:
        safe_print(f"error: {e}", file=sys.stderr)
        return 2
