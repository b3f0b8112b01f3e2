"""One sweep case run and turned into its result row (a plain, JSON-ready dict).

Row fields (README "Sweeps"); everything but `timing` is a function of the case's settings,
the code and torch, so a case run on any shard, in any worker, gives the same row:

    id, index, settings, run        the case, and the `python -m ladder run` that repeats it
    status, message                 pass | fail | error; the error or plain-path divergence
    points, failing, not_compared   rows compared, rows failing, points hidden from comparison
    worst                           {step, point, layer, position, error}: the largest error
    first_divergence                {step, point, layer, position, error, kind, verdict};
                                    kind own | inherited | whole-forward | plain path | ...
    layers                          {"L00": worst error, ..., "embed/final": ...}
    logits                          {positions, argmax_agree, near_ties, topk_agree, max_kl}
    port, params_sha256, torch, threads
    archive                         {path, sha256, bytes} of the trace archive, or null
    timing                          {seconds, started}: the only fields that vary run to run

An error is a fraction of its rule's allowance (pass <= 1); one that is not finite (a NaN or
Inf capture, a point not traced) is the string "unbounded", since JSON holds no infinity.
"""
from __future__ import annotations

import contextlib
import io
import math
import os

WHOLE = "embed/final"            # the points outside every layer: embed, Engram, the head


def frac(x):
    """A JSON-ready fraction of allowance (NaN counts as unbounded, as Comparison.worst)."""
    return float(x) if x is not None and math.isfinite(x) else "unbounded"


def frac_key(v) -> float:
    """A row's fraction back as a number to sort or colour by."""
    return math.inf if v == "unbounded" else (-1.0 if v is None else float(v))


def empty_row(case, run: str) -> dict:
    return {"id": case.id, "index": case.index, "settings": dict(case.settings), "run": run,
            "status": "error", "message": None, "points": None, "failing": None,
            "not_compared": None, "worst": None, "first_divergence": None, "layers": {},
            "logits": None, "port": None, "params_sha256": None, "torch": None,
            "threads": None, "archive": None, "timing": None}


def _layers(cmp) -> dict:
    worst = {}
    for r in cmp.rows:
        key = WHOLE if r.layer is None else f"L{r.layer:02d}"
        worst[key] = max(worst.get(key, -1.0), frac_key(frac(r.error)))
    keys = sorted(k for k in worst if k != WHOLE) + ([WHOLE] if WHOLE in worst else [])
    return {k: frac(worst[k]) for k in keys}


def _divergence(loc, cmp) -> dict:
    first = loc.first if loc is not None else cmp.first
    kind, verdict = "no injection", getattr(loc, "verdict", "")
    if first.layer is None:
        kind = "whole-forward"
    elif loc is not None:
        at = next((r for r in loc.injection if r.point == first.point), None)
        if at is not None:
            kind = "own" if at.own else "inherited"
    pos = first.first_bad_pos if first.first_bad_pos is not None else first.worst_pos
    return {"step": first.step, "point": first.point, "layer": first.layer,
            "position": getattr(loc, "position", pos), "error": frac(first.first_bad_error),
            "kind": kind, "verdict": verdict}


def _compared(args, out):
    """compare_run, then locate on a divergence, both inside a planted fault's context."""
    from . import cli
    from .locate import locate
    cmp, extra, port, ref, model, window, info = cli.compare_run(args, out)
    loc, why = None, ""
    if not cmp.passed:
        try:
            loc = locate(cmp, port=port, ref=ref, model=model, window=window)
        except Exception as e:              # the row still names the first divergence
            why = f"locate failed: {type(e).__name__}: {e}"
    out("")
    out(str(cmp))
    out(str(loc) if loc is not None else why or "no divergence: every point passes its rule")
    return cmp, extra, loc, why, port, model, info


def _compared_port(args, out):
    """A protocol port's case (`port = "module:factory"`): judged as `run --port` judges it
    (ladder/judge.py: the reference's layer re-run on the port's recorded inputs)."""
    from .judge import ModelUnderTest, judge
    model = ModelUnderTest.build(preset=args.preset, seed=args.seed, params=args.params,
                                 cact=args.cact, weights=args.weights, bits_map=args.bits_map,
                                 max_memory=args.max_memory)
    v = judge(args.port, model, prompt_len=args.prompt_len, steps=args.steps,
              window=args.window, rules=args.rules, check_plain=not args.no_check_plain)
    out(v.message())
    info = {"port": v.label, "params sha256": model.src["sha256"][:16]}
    return v.cmp, [], v.location, "", v.obtained, model, info


def _archive(args, port, model) -> tuple:
    """(ladder, Ladder.save keywords): the port's side, with the manifest `dump` writes."""
    from .compare_cli import _version, file_sha256
    from .geometry import geometry_of
    file = args.cact or args.params
    cfg = model.cfg
    return port, {
        "producer": {"name": "needle-parity " + ("port (sweep)" if args.port else
                                                 "port.V2Model (sweep)"),
                     "version": _version(), "backend": args.port or args.backend,
                     "device": args.device, "dtype": "float32"},
        "geometry": geometry_of(cfg),
        "kv_window": cfg.kv_window if args.window is None else args.window,
        "weights": {"source": "cact" if args.cact else "params" if args.params else "init",
                    "file": os.path.basename(file) if file else args.preset,
                    "sha256": file_sha256(file) if file else None, "params_sha256": None},
        "prompt_len": args.prompt_len}


def case_row(case, base: str):
    """(row without archive/timing, the run's printed lines, (ladder, manifest) or None)."""
    import torch
    from . import cli
    from .args import check
    from .sweep import _run_args
    from .sweep_grid import run_argv
    from .trace import TraceError
    row = empty_row(case, " ".join(["python -m ladder run", *run_argv(case, None)]))
    lines, archive = [], None
    try:
        args = _run_args(case, base)
        check(args)
        # the capture bar draws on a terminal: in a sweep it would interleave across workers
        with contextlib.redirect_stderr(io.StringIO()):
            got = (_compared_port(args, lines.append) if args.port else
                   cli._with_fault(_compared, args, lines.append) if args.plant
                   else _compared(args, lines.append))
        cmp, extra, loc, why, port, model, info = got
        failing = cmp.total_failing if cmp.folded else len(cmp.failures)
        ok = cmp.passed and all(c.passed for c in extra)
        w = cmp.worst()
        row.update(status="pass" if ok else "fail", message=why or None,
                   points=cmp.total_rows if cmp.folded else len(cmp.rows), failing=failing,
                   not_compared=len(cmp.hidden), layers=_layers(cmp),
                   port=info["port"], params_sha256=info["params sha256"])
        if w is not None:
            row["worst"] = {"step": w.step, "point": w.point, "layer": w.layer,
                            "position": w.worst_pos, "error": frac(w.error)}
        if not cmp.passed:
            row["first_divergence"] = _divergence(loc, cmp)
        if cmp.logits:
            kl = max(r.kl for r in cmp.logits)
            row["logits"] = {"positions": len(cmp.logits),
                             "argmax_agree": sum(r.argmax_agree for r in cmp.logits),
                             "near_ties": sum(r.near_tie for r in cmp.logits),
                             "topk_agree": sum(r.topk_agree for r in cmp.logits),
                             "max_kl": kl if math.isfinite(kl) else None}
        archive = _archive(args, port, model)
    except TraceError as e:                 # a plain path parts from the traced one
        row.update(status="fail", message=f"divergence: {e}",
                   first_divergence={"step": None, "point": None, "layer": None,
                                     "position": None, "error": None, "kind": "plain path",
                                     "verdict": str(e)})
    except cli._input_errors() as e:
        row["message"] = f"error: {e}"
    except Exception as e:                  # a crash is one case's error, not the sweep's end
        row["message"] = f"internal error: {type(e).__name__}: {e}"
    if row["message"] and row["status"] != "pass":
        lines.append(row["message"])
    row["torch"], row["threads"] = torch.__version__, torch.get_num_threads()
    return row, lines, archive
