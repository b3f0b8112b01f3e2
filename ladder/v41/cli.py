"""`python -m ladder run | locate | report --model attn_v41`: the V4.1 attention through the
same tables, locate and report as needle v2 (ladder/cli/main.py dispatches here).

run     reference vs the official fixture, port vs reference (tolerance tables, first
        divergence), and decode="graph" vs eager on every capturable layer-step (bytes;
        always run: on CUDA real capture and replay, else the capturable body on the static
        buffers, and the line says which)
locate  the same comparisons, then ladder/v41/locate.py on the first divergence
report  markdown, CSV and HTML (with the error-growth plot) of port vs reference, and the same
        three of reference vs official beside them ({stem}-official.*)

Options that apply: --fixture, --backend torch|triton, --device, --rules (patterns
"v41_official/L*.name" and "v41_port/L*.name"), --per-step, --max-memory (the budget the
fixture's geometry is held to, ladder/v41/sides.py's implied_bytes), and report's --out, --stem,
--plot. Any other option (they describe a needle v2 run; --fine picks points outside the
coarse ladder, and every V4.1 point is shown already) is refused with exit 2.
"""
from __future__ import annotations

import os
import time

import torch

from ladder.engine.rules import V41_RULESET, V41_SIDES, load_rules
from ladder.v41.sides import (DEFAULT_STEM, V41FixtureError, compare, graph_vs_eager, load_fixture,
                              run_side)

# dest -> option: what a needle v2 run reads and a V4.1 run has no use for
NOT_FOR_V41 = {"preset": "--preset", "params": "--params", "cact": "--cact", "seed": "--seed",
               "prompt_len": "--prompt-len", "steps": "--steps", "window": "--window",
               "weights": "--weights", "bits_map": "--bits-map", "decode": "--decode",
               "no_check_plain": "--no-check-plain", "fine": "--fine", "plant": "--plant",
               "list_faults": "--list-faults"}


def refuse_other_options(args, argv, defaults) -> None:
    """Raise V41FixtureError naming the first option given that does not apply to attn_v41
    (given: on the command line, or a value other than its default)."""
    argv = list(argv or [])
    for dest, flag in NOT_FOR_V41.items():
        named = any(a == flag or a.startswith(flag + "=") for a in argv)
        if named or getattr(args, dest, None) != getattr(defaults, dest, None):
            raise V41FixtureError(f"{flag} does not apply to --model attn_v41 (it reads the "
                                  f"fixture's own calls and weights; options: --fixture, "
                                  f"--backend, --device, --rules, --per-step, "
                                  f"--max-memory)")


def compare_run(args, out=print):
    """Everything run / locate / report share: (port-vs-reference Comparison, reference-vs-
    official Comparison, context for locate, info for the report)."""
    from port.v41.attn import AttnV41 as Port
    from reference.v41.attn import AttnV41 as Ref
    torch.set_num_threads(1)       # tiny tensors: a second thread only adds contention
    t0 = time.perf_counter()
    rules = load_rules(args.rules, V41_SIDES) if args.rules else V41_RULESET
    stem = args.fixture or DEFAULT_STEM
    man, rec, w = load_fixture(stem, getattr(args, "max_memory", None))
    off, ma = man["official"], man["model_args"]
    out(f"needle-parity ladder, model attn_v41: fixture {os.path.basename(stem)} of "
        f"{off.get('repo')} @ {(off.get('revision') or '')[:12]} (model.py sha256 "
        f"{(off.get('sha256') or '')[:16]}..., {off.get('used')})")
    make_port = lambda decode="eager": Port(ma, w, backend=args.backend, decode=decode,  # noqa
                                            device=args.device)
    make_ref = lambda: Ref(ma, w)  # noqa: E731
    port = make_port()                                            # refuses a bad geometry
    a = port.args
    out(f"model: {a.n_layers} layers, ratios {list(a.ratios)}, kv sources {list(a.kv_sources)}, "
        f"index sources {list(a.index_sources)}, candidate source {a.candidate_source}"
        f"{f', MTP layers built {port.mtp}' if port.mtp else ''}; {len(man['calls'])} calls "
        f"({', '.join(s['name'] for s in man.get('scenarios', []))})")
    ta = time.perf_counter()
    ref_run = run_side(make_ref(), man, rec)
    tb = time.perf_counter()
    port_run = run_side(port, man, rec)
    tc = time.perf_counter()
    official = compare(ref_run, rec, "v41_official", man["calls"], rules, "reference", "official")
    cmp = compare(port_run, ref_run, "v41_port", man["calls"], rules,
                  f"port ({args.backend}, eager, {args.device})", "reference")
    td = time.perf_counter()
    info = {"model": f"attn_v41, fixture {os.path.basename(stem)}",
            "official": f"{off.get('repo')} @ {(off.get('revision') or '')[:12]}",
            "reference vs official": f"{len(official.rows) - len(official.failures)}/"
                                    f"{len(official.rows)} points pass",
            "port": f"{args.backend} on {args.device}, eager",
            "rules": rules.source, "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "timing": f"reference {tb - ta:.2f} s, port {tc - tb:.2f} s, compare "
                      f"{td - tc:.2f} s, total {td - t0:.2f} s"}
    ctx = dict(man=man, rec=rec, port_run=port_run, make_port=make_port, make_ref=make_ref)
    return cmp, official, ctx, info


def _print(cmp, args, out):
    from ladder.engine.table import summary, to_text
    df = cmp.to_frame()
    out("")
    out(to_text(df if args.per_step else summary(df)))
    out(str(cmp))


def cmd_run(args, out=print) -> int:
    cmp, official, ctx, info = compare_run(args, out)
    for c in (official, cmp):
        _print(c, args, out)
    man, rec = ctx["man"], ctx["rec"]
    graph = ctx["make_port"]("graph")
    n, bad = graph_vs_eager(None, graph, man, rec, ctx["port_run"])
    how = (f"CUDA: {graph.graphs.captures} graphs captured and replayed, one per run of "
           f"consecutive capturable layers {graph.segments()}"
           if graph.dev.type == "cuda" else
           "no CUDA: capturable body run eagerly on static buffers; capture+replay is "
           "tests/port/v41/test_cuda.py")
    out("")
    out(f"decode graph vs eager: {n - len(bad)}/{n} capturable layer-steps byte-identical "
        f"({how})" + (f"; first mismatch {bad[0]}" if bad else ""))
    out(f"{info['timing']}; torch {info['torch']}, {info['threads']} threads")
    ok = cmp.passed and official.passed and not bad
    if not ok:
        out("divergence: `python -m ladder locate --model attn_v41` (same options) scans "
            "it and splits local from propagated error")
    return 0 if ok else 1


def _locate(cmp, ctx):
    from ladder.v41.locate import locate_v41
    return locate_v41(cmp, ctx["make_port"], ctx["make_ref"], ctx["man"], ctx["rec"])


def cmd_locate(args, out=print) -> int:
    cmp, official, ctx, info = compare_run(args, out)
    out("")
    out(str(official))
    out(str(cmp))
    loc = _locate(cmp, ctx)
    out("")
    out(str(loc) if loc is not None else "no divergence: every point passes its rule")
    return 0 if loc is None and official.passed else 1


def cmd_report(args, out=print) -> int:
    from ladder.engine.report import render_report, write_report
    cmp, official, ctx, info = compare_run(args, out)
    loc = _locate(cmp, ctx)
    # the reference against DeepSeek's own code, in the same three forms beside it; all six
    # files land together or none does
    files_off, paths_off = render_report(official, args.out, None, info,
                                         stem=f"{args.stem}-official", plot_backend=args.plot)
    paths = write_report(cmp, args.out, loc, info, stem=args.stem, plot_backend=args.plot,
                         also=files_off)
    out(str(official))
    out(str(cmp))
    for p in [*paths.values(), *paths_off.values()]:
        out(f"wrote {p} ({os.path.getsize(p)} bytes)")
    return 0 if cmp.passed and official.passed else 1
