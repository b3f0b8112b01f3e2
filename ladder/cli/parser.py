"""The command line's parser: every command and flag with its help (`python -m ladder --help`,
`python -m ladder COMMAND --help`). The help is the reference: each flag says what it does and
its default; docs/cli.md's flag tables are held to it (tests/ladder/cli/test_help.py).
"""
from __future__ import annotations

import argparse
import re

from bounded.size import DEFAULT_MAX_MEMORY, cli_size
from ladder.sides.defaults import DEFAULT_PROMPT, DEFAULT_STEPS   # no torch: --help is fast

DESCRIPTION = ("`python -m ladder run | locate | report | shrink | regen | compare | dump | rules "
               "| points | sweep`: a port of needle v2 beside the reference, point by point "
               "(COMMAND --help: its flags and their defaults)")


class DefaultsShown(argparse.HelpFormatter):
    """Every optional flag's help ends with its default, unless it already names one."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (text is argparse.SUPPRESS or not action.option_strings or "default" in text.lower()
                or action.default is argparse.SUPPRESS or action.required
                or isinstance(action, argparse._HelpAction)):
            return text
        if isinstance(action, argparse._StoreTrueAction):
            shown = "off"
        elif action.default is None:
            shown = "none"
        else:
            shown = "%(default)s"
        return f"{text} (default: {shown})".lstrip()


MAX_SECONDS = 10 ** 6          # a time bound past ~11.6 days is a typo, not a plan


def seconds(text: str) -> float:
    """A time bound: plain ASCII digits with an optional fraction and exponent, finite, in
    (0, MAX_SECONDS]. float() alone would take 'nan', 'inf', '1_0' and other scripts' digits."""
    if len(text) > 32 or not re.fullmatch(r"[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?", text):
        raise argparse.ArgumentTypeError(f"{text[:32]!r} is not a number of seconds "
                                         f"(ASCII digits, e.g. 30 or 2.5)")
    value = float(text)
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text} seconds is outside (0, {MAX_SECONDS}]")
    return value


def nonempty(what: str):
    """An argparse type: any text but the empty one (which would silently mean 'none')."""
    def check(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"an empty {what} names nothing")
        return text
    check.__name__ = what
    return check


class Parser(argparse.ArgumentParser):
    """argparse's parser with DefaultsShown as its help formatter."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsShown)
        super().__init__(*args, **kwargs)


def model_args(p, regen=False):
    p.add_argument("--preset", default="tiny", choices=["tiny", "shipped"],
                   help="the built-in model (seeded, perturbed init) when neither --params nor "
                        "--cact is given")
    p.add_argument("--params", help="safetensors parameter file (config in its metadata)")
    p.add_argument("--cact", help=".cact checkpoint: the port computes from its packed CQ codes "
                                  "(--weights cq, the default here), the reference from the "
                                  "exactly dequantised float32 weights")
    p.add_argument("--seed", type=int, default=0, help="parameter init and token seed")
    p.add_argument("--prompt-len", type=int, default=DEFAULT_PROMPT,
                   help="prompt positions, fed as one prefill")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="one-token decode steps")
    p.add_argument("--window", type=int, default=None,
                   help="attention window (default: the model's kv_window)")
    memory_arg(p)
    if regen:
        return
    p.add_argument("--model", default="needle_v2", choices=["needle_v2", "attn_v41"],
                   help="needle_v2 (default) or attn_v41: DeepSeek-V4.1 attention, reference vs "
                        "the official fixture and port vs reference (run also checks graph vs "
                        "eager on every capturable layer-step). --fixture, --backend "
                        "torch|triton, --device, --rules, --per-step apply; any other "
                        "model option is refused (ladder/v41/cli.py)")
    p.add_argument("--rules", help="tolerance rules file (.toml or .json; see `ladder rules`)")
    p.add_argument("--weights", default=None, metavar="{dense,cq}",
                   help="port weight form: dense (float32) or cq (Cactus-Quants codes; the "
                        "reference then runs on the exactly dequantised weights) (default: cq "
                        "with --cact, else dense)")
    p.add_argument("--bits-map", default="embedding=4,mhc=4,default=2",
                   help="CQ widths when --weights cq quantises --params/--preset weights")
    p.add_argument("--device", default="cpu", help="port device (the reference runs on CPU)")
    p.add_argument("--backend", default="torch", choices=["torch", "triton", "native"],
                   help="the port's kernels: torch ops with the torch attention twin; triton, "
                        "the fused Triton decode body (port/fused.py: about 7 kernel launches "
                        "per layer, Triton sparse attention; needs the [gpu] extra, on a CPU "
                        "only under TRITON_INTERPRET=1 and slow: the tiny model); or native, the "
                        "C step (CPU; with --weights cq it reads the packed codes)")
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
                   "the backend's own code (ladder/sides/faults.py; demo: the run must exit 1)")
    p.add_argument("--list-faults", action="store_true", help="list the plantable faults")
    p.add_argument("--port", default=None, metavar="MODULE:FACTORY",
                   help="compare an in-process port of the protocol (ladder/sides/ports.py) instead "
                        "of port.V2Model; locate re-runs the reference's layer from its inputs")
    port_timeout_arg(p)
    precision_arg(p)
    p.add_argument("--dump", default=None, metavar="FILE",
                   help="the port side is this recording (a trace archive or a needle-rs "
                        "fixture): run, locate and report judge it as `compare FILE` does")


def precision_arg(p):
    p.add_argument("--port-precision", default=None, metavar="SPEC",
                   help="what the port computes in, e.g. bfloat16, float16, 'float32,kv=int8', "
                        "'act=bfloat16,weights=cq,kv=int8' (docs/precision.md): below float32 "
                        "it is judged against a noise floor, the reference re-run at that "
                        "precision; our port runs at it (torch backend, eager; or the triton "
                        "backend's fused body with kv in the activation dtype); a recording's "
                        "or protocol port's own declaration is used when this is not given "
                        "(default: none: float32, or what the side declares)")


def port_timeout_arg(p):
    p.add_argument("--port-timeout", type=float, default=None, metavar="SECONDS",
                   help="--port: a factory, make_state() or step call that runs longer is an "
                        "error naming it (SIGALRM; default: none, no limit)")


def memory_arg(p):
    p.add_argument("--max-memory", type=cli_size, default=None, metavar="SIZE",
                   help=f"budget for the tables a geometry implies (parameters, RoPE, KV and "
                        f"Engram rings), e.g. 4G; files needing more are refused before "
                        f"anything is allocated (default {DEFAULT_MAX_MEMORY >> 30}G)")


def shrink_args(p) -> None:
    """shrink's own flags (ladder/cli/shrink.py), beside run's."""
    p.add_argument("--max-time", type=seconds, default=None, metavar="SECONDS",
                   help="stop the search after this long; the smallest schedule found so far "
                        "is the answer (default: none, search to a fixpoint)")
    p.add_argument("--out", type=nonempty("directory"), default=None, metavar="DIR",
                   help="write the pytest file that reproduces the shrunk divergence there "
                        "(test_shrunk_divergence.py, pytest.ini, README.md)")
    p.add_argument("--force", action="store_true",
                   help="with --out: replace a reproducer already in DIR (a link is never "
                        "replaced)")
    p.add_argument("--point", type=nonempty("point"), default=None,
                   help="the divergence to keep: this first "
                   "divergent point, e.g. L03.q (default: the unshrunk run's)")
    p.add_argument("--verdict", default=None, choices=["own", "inherited", "undecided", "path"],
                   help="the divergence to keep: this own/inherited verdict (default: the "
                        "unshrunk run's)")
    p.add_argument("--from-sweep", nargs=2, default=None, metavar=("DIR", "CASE"),
                   help="shrink a sweep's case: its run flags from DIR/cases/CASE*/result.json")


def build_parser(more=()) -> argparse.ArgumentParser:
    """Every command's parser; `more`: functions adding further subcommands (sweep's, from
    ladder/cli/main.py, which sits above the sweep package)."""
    ap = Parser(prog="python -m ladder", description=DESCRIPTION)
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    for name, helptext in (("run", "port beside reference: tolerance table, first divergence"),
                           ("locate", "scan the first divergence's layer (linear, forward order); local vs "
                            "propagated error"),
                           ("report", "write markdown, CSV and HTML reports")):
        p = sub.add_parser(name, help=helptext)
        model_args(p)
        if name == "report":
            p.add_argument("--out", default="ladder-report", help="output directory")
            p.add_argument("--stem", default="ladder", help="file name stem")
            p.add_argument("--plot", default="auto", choices=["auto", "svg", "png"],
                           help="figure format (auto: PNG via matplotlib if installed)")
    p = sub.add_parser("shrink", help="shrink a divergence to its smallest reproducer (fewest "
                       "positions, shortest prompt, smallest window) and write it as a pytest "
                       "file")
    model_args(p)
    shrink_args(p)
    p = sub.add_parser("regen", help="regenerate the forward-parity fixture")
    model_args(p, regen=True)
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
                           "upstream-jax or a TOML file (ladder/formats/namemap.py)")
            p.add_argument("--locate", action="store_true", help="on a divergence, re-run the "
                           "reference's layer from the candidate's recorded inputs")
            p.add_argument("--report", default=None, metavar="DIR", help="also write the "
                           "markdown, CSV and HTML report there")
            p.add_argument("--stem", default="compare", help="report file name stem")
            p.add_argument("--fine", action="store_true",
                           help="print every point, not the coarse ladder")
            p.add_argument("--per-step", action="store_true",
                           help="print one row per (step, point)")
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
        model_args(p, regen=True)
        p.add_argument("--rules", help="tolerance rules file (.toml or .json)")
        p.add_argument("--weights", default=None, choices=[None, "dense", "cq"],
                       metavar="{dense,cq}", help="weight form of a live side of ours "
                       "(default: cq with --cact, else dense)")
        p.add_argument("--bits-map", default="embedding=4,mhc=4,default=2",
                       help="CQ widths when --weights cq quantises --params/--preset weights")
        p.add_argument("--device", default="cpu",
                       help="device of a live port side (the reference runs on CPU)")
        p.add_argument("--backend", default="torch", choices=["torch", "triton", "native"],
                       help=argparse.SUPPRESS)
        p.add_argument("--decode", default="eager", choices=["eager", "graph"],
                       help="a live port side's step: eager, or host prep + the capturable "
                            "device body")
        p.add_argument("--port", default=None, metavar="MODULE:FACTORY",
                       help="an in-process port (ladder/sides/ports.py): side 'port'")
        port_timeout_arg(p)
        precision_arg(p)
        p.add_argument("--no-check-plain", action="store_true",
                       help="skip proving that tracing changes no bit on a live side")
        p.add_argument("--model", default="needle_v2", choices=["needle_v2", "attn_v41"],
                       help="attn_v41: the V4.1 attention's ladder over its fixture's calls "
                            "(sides: an archive, official, reference, torch, triton)")
        p.add_argument("--fixture", default=None, help="attn_v41: the fixture stem (default: "
                       "the committed one)")
    p = sub.add_parser("rules", help="print the tolerance rules (default or --rules FILE)")
    p.add_argument("--rules", help="print this rules file (checked) instead of the defaults")
    p.add_argument("--format", default="toml", choices=["toml", "json"],
                   help="the file format printed")
    p.add_argument("--model", default="needle_v2", choices=["needle_v2", "attn_v41"],
                   help="whose default rules to print (attn_v41: V41_RULES)")
    p.add_argument("--noise", action="store_true",
                   help="print NOISE_RULES, the defaults for a side that declares a precision "
                        "below float32 (docs/precision.md)")
    from ladder.cli.points import add_parser as add_points_parser
    add_points_parser(sub)
    for add in more:
        add(sub)
    return ap
