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
    systematic                      {unit, points: {point: {margins, sums}}}: the per-position
                                    sums of the systematic statistics, pooled by the report
                                    (ladder/sweep/pooled.py), or null
    archive                         {path, sha256, bytes} of the trace archive, or null
    timing                          {seconds, started}

`timing`, `threads` and the thread count inside `port` ("..., 2 torch threads") follow the run
environment (-j, --threads), not the case: RUN_ENV, which `--merge` leaves out when it checks
that two runs of one case agree. Every other field is the same on any shard, in any worker.

An error is a fraction of its rule's allowance (pass <= 1); one that is not finite (a NaN or
Inf capture, a point not traced) is the string "unbounded", since JSON holds no infinity.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import re
import stat

WHOLE = "embed/final"            # the points outside every layer: embed, Engram, the head
MAX_ROW = 16 << 20               # bytes of one result.json (a shipped-preset row is ~10 KB)
RUN_ENV = ("timing", "threads")  # row fields set by the run environment, not the case
_THREADS = re.compile(r"\b\d+ (\w+) threads?\b")   # runinfo.thread_count's "2 torch threads"


def frac(x):
    """A JSON-ready fraction of allowance (NaN counts as unbounded, as Comparison.worst)."""
    return float(x) if x is not None and math.isfinite(x) else "unbounded"


def frac_key(v) -> float:
    """A row's fraction back as a number to sort or colour by."""
    return math.inf if v == "unbounded" else (-1.0 if v is None else float(v))


def empty_row(case, run: str) -> dict:
    """Every field a row has (ROW_FIELDS, in order), none of them known yet."""
    return {"id": case.id, "index": case.index, "settings": dict(case.settings), "run": run,
            "status": "error", "message": None, "points": None, "failing": None,
            "not_compared": None, "worst": None, "first_divergence": None, "layers": {},
            "logits": None, "port": None, "params_sha256": None, "torch": None,
            "threads": None, "systematic": None, "archive": None, "timing": None}


ROW_FIELDS = ("id", "index", "settings", "run", "status", "message", "points", "failing",
              "not_compared", "worst", "first_divergence", "layers", "logits", "port",
              "params_sha256", "torch", "threads", "systematic", "archive", "timing")


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
    elif loc is not None and loc.split is not None:
        kind = loc.split
    pos = first.first_bad_pos if first.first_bad_pos is not None else first.worst_pos
    return {"step": first.step, "point": first.point, "layer": first.layer,
            "position": getattr(loc, "position", pos), "error": frac(first.first_bad_error),
            "kind": kind, "verdict": verdict}


def _compared(args, out):
    """compare_run, then locate on a divergence, both inside a planted fault's context."""
    from ladder.cli.commands import compare_run, locate_run
    cmp, extra, port, ref, model, window, info = compare_run(args, out)
    loc, why = None, ""
    if not cmp.passed:
        try:
            loc = locate_run(args, cmp, port, ref, model, window)
        except Exception as e:              # the row still names the first divergence
            why = f"locate failed: {type(e).__name__}: {e}"
    out("")
    out(str(cmp))
    out(str(loc) if loc is not None else why or "no divergence: every point passes its rule")
    return cmp, extra, loc, why, port, model, info


def _compared_port(args, out):
    """A protocol port's case (`port = "module:factory"`): judged as `run --port` judges it
    (ladder/sides/judge.py: the reference's layer re-run on the port's recorded inputs)."""
    from ladder.sides.judge import ModelUnderTest, judge
    model = ModelUnderTest.build(preset=args.preset, seed=args.seed, params=args.params,
                                 cact=args.cact, weights=args.weights, bits_map=args.bits_map,
                                 max_memory=args.max_memory)
    v = judge(args.port, model, prompt_len=args.prompt_len, steps=args.steps,
              window=args.window, rules=args.rules, check_plain=not args.no_check_plain,
              precision=getattr(args, "port_precision", None))
    out(v.message())
    info = {"port": v.label, "params sha256": model.src["sha256"][:16]}
    return v.cmp, [], v.location, "", v.obtained, model, info


def _archive(args, port, model) -> tuple:
    """(ladder, Ladder.save keywords): the port's side, with the manifest `dump` writes."""
    from ladder.sides.side_spec import file_sha256, project_version
    from ladder.model.geometry import geometry_of
    file = args.cact or args.params
    cfg = model.cfg
    return port, {
        "producer": {"name": "needle-parity " + ("port (sweep)" if args.port else
                                                 "port.V2Model (sweep)"),
                     "version": project_version(), "backend": args.port or args.backend,
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
    from ladder.cli.args import check
    from ladder.cli.commands import with_fault
    from ladder.cli.errors import input_errors
    from ladder.sweep.grid import run_args, run_argv
    from ladder.engine.trace import TraceError
    from ladder.sides.model_input import computing
    from ladder.sweep.pooled import row_field
    row = empty_row(case, " ".join(["python -m ladder run", *run_argv(case, None)]))
    lines, archive = [], None
    try:
        args = run_args(case, base)
        check(args)
        # the capture bar draws on a terminal: in a sweep it would interleave across workers
        with contextlib.redirect_stderr(io.StringIO()), computing(args):
            got = (_compared_port(args, lines.append) if args.port else
                   with_fault(_compared, args, lines.append) if args.plant
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
                            "position": w.worst_pos, "error": frac(w.error),
                            "noise_ratio": None if math.isnan(w.noise_ratio)
                            else frac(w.noise_ratio)}
        if not cmp.passed:
            row["first_divergence"] = _divergence(loc, cmp)
        if cmp.logits:
            kl = max(r.kl for r in cmp.logits)
            row["logits"] = {"positions": len(cmp.logits),
                             "argmax_agree": sum(r.argmax_agree for r in cmp.logits),
                             "near_ties": sum(r.near_tie for r in cmp.logits),
                             "topk_agree": sum(r.topk_agree for r in cmp.logits),
                             "max_kl": kl if math.isfinite(kl) else None}
        row["systematic"] = row_field(cmp)
        archive = _archive(args, port, model)
    except TraceError as e:                 # a plain path parts from the traced one
        row.update(status="fail", message=f"divergence: {e}",
                   first_divergence={"step": None, "point": None, "layer": None,
                                     "position": None, "error": None, "kind": "plain path",
                                     "verdict": str(e)})
    except input_errors() as e:
        row["message"] = f"error: {e}"
    except Exception as e:                  # a crash is one case's error, not the sweep's end
        row["message"] = f"internal error: {type(e).__name__}: {e}"
    if row["message"] and row["status"] != "pass":
        lines.append(row["message"])
    row["torch"], row["threads"] = torch.__version__, torch.get_num_threads()
    return row, lines, archive


def run_env_free(row: dict) -> dict:
    """The row without what the run environment sets: RUN_ENV, and the thread count that
    `port` embeds (kept as "N torch threads", so another backend's label still differs)."""
    out = {k: v for k, v in row.items() if k not in RUN_ENV}
    if isinstance(out.get("port"), str):
        out["port"] = _THREADS.sub(r"N \1 threads", out["port"])
    return out


# ------------------------------------------------------------ reading a row back
# A result.json is read as a hostile file: the sweep wrote it, but a shard copied between
# machines or a directory someone edited may hold anything, and the report indexes into it.
STATUSES = ("pass", "fail", "error")
_NUM = "a number >= 0 or \"unbounded\""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_frac(v) -> bool:
    return v == "unbounded" or (isinstance(v, (int, float)) and not isinstance(v, bool)
                                and v >= 0)


def _opt(test, what):
    return (lambda v: v is None or test(v)), f"{what} or null"


_STR = (lambda v: isinstance(v, str)), "a string"
_INT = (lambda v: _is_int(v) and v >= 0), "an integer >= 0"
_FRAC = _is_frac, _NUM
_POINT = {"step": _opt(*_STR), "point": _opt(*_STR), "layer": _opt(*_INT),
          "position": _opt(*_INT)}
SUB = {
    "worst": dict(_POINT, error=_FRAC, noise_ratio=_opt(*_FRAC)),   # x floor: three-way
    "first_divergence": dict(_POINT, error=_opt(*_FRAC), kind=_STR, verdict=_STR),
    "logits": {"positions": _INT, "argmax_agree": _INT, "near_ties": _INT,
               "topk_agree": _INT, "max_kl": _opt(lambda v: _is_frac(v) and v != "unbounded",
                                                  "a number >= 0")},
    "archive": {"path": _STR, "sha256": _STR, "bytes": _INT},
    "timing": {"seconds": _opt(lambda v: _is_frac(v) and v != "unbounded", "a number >= 0"),
               "started": _opt(*_STR)},
}
_SETTING = (lambda v: isinstance(v, (str, bool)) or _is_int(v)), "a string, integer or boolean"
SCALARS = {
    "id": _STR, "index": _INT, "run": _STR,
    "status": ((lambda v: v in STATUSES), " or ".join(map(repr, STATUSES))),
    "message": _opt(*_STR), "points": _opt(*_INT), "failing": _opt(*_INT),
    "not_compared": _opt(*_INT), "port": _opt(*_STR), "params_sha256": _opt(*_STR),
    "torch": _opt(*_STR), "threads": _opt(*_INT),
}


def _shown(v) -> str:
    import json
    text = json.dumps(v, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _check(where: str, field: str, v, test) -> None:
    ok, what = test
    if not ok(v):
        from ladder.sweep.grid import SweepError
        raise SweepError(f"{where}: field {field!r} = {_shown(v)}: must be {what}")


def _same_keys(where: str, v: dict, fields: list, prefix: str = "") -> None:
    from ladder.sweep.grid import SweepError
    for k in [k for k in fields if k not in v] + [k for k in v if k not in fields]:
        raise SweepError(f"{where}: field '{prefix}{k}' is "
                         f"{'missing' if k in fields else 'not a row field'}")


def _check_table(where: str, field: str, v, spec: dict) -> None:
    from ladder.sweep.grid import SweepError
    if not isinstance(v, dict):
        raise SweepError(f"{where}: field {field!r} = {_shown(v)}: must be an object "
                         f"{{{', '.join(spec)}}} or null")
    _same_keys(where, v, list(spec), f"{field}.")
    for k, test in spec.items():
        _check(where, f"{field}.{k}", v[k], test)


def check_row(row, where: str) -> dict:
    """`row` if it has every field the report reads, each of its type; else SweepError
    naming `where` (the file) and the field."""
    from ladder.sweep.grid import KEYS, SweepError
    if not isinstance(row, dict):
        raise SweepError(f"{where}: a result row must be a JSON object, not {_shown(row)}")
    _same_keys(where, row, ROW_FIELDS)
    for k, test in SCALARS.items():
        _check(where, k, row[k], test)
    for k, spec in SUB.items():
        if row[k] is not None:
            _check_table(where, k, row[k], spec)
    from ladder.sweep.pooled import check_field
    wrong = check_field(row["systematic"])
    if wrong:
        raise SweepError(f"{where}: field 'systematic' is malformed: {wrong}")
    for k, spec in (("settings", (lambda s: s in KEYS, _SETTING)),
                    ("layers", (lambda s: isinstance(s, str), _FRAC))):
        if not isinstance(row[k], dict):
            raise SweepError(f"{where}: field {k!r} = {_shown(row[k])}: must be an object")
        key_ok, value_test = spec
        for name, v in row[k].items():
            if not key_ok(name):
                raise SweepError(f"{where}: field '{k}' has key {_shown(name)}: "
                                 f"{'not a grid key' if k == 'settings' else 'not a layer'}")
            _check(where, f"{k}.{name}", v, value_test)
    return row


def read_result(path: str, limit: int = MAX_ROW):
    """The JSON of a result.json that is a regular file (never a link: a row is the sweep's
    own file, and a link could make one directory's result another's), capped at `limit`;
    SweepError otherwise. O_NOFOLLOW refuses the link on the open itself, so nothing can
    swap one in between a check and the read."""
    from bounded.io import parse_json
    from ladder.sweep.grid import SweepError
    case_dir = os.path.dirname(path)
    if os.path.islink(case_dir):
        raise SweepError(f"{case_dir}: a case directory that is a symbolic link; refused")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) |
                     getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        why = "a symbolic link" if os.path.islink(path) else e.strerror
        raise SweepError(f"{path}: result file: {why}; refused") from None
    try:                                # checked on the descriptor: a directory opens too
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SweepError(f"{path}: result file is not a regular file; refused")
        if st.st_size > limit:
            raise SweepError(f"{path}: {st.st_size} bytes exceeds the result file limit "
                             f"{limit}")
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise SweepError(f"{path}: grew past the result file limit {limit} while read")
    return parse_json(raw, path, SweepError)


def read_row(out: str, case):
    """(the case's finished row, None) or (None, why it is not done): no result yet, or one
    that is not a regular file, does not parse, lacks a field or is another case's row."""
    from ladder.sweep.grid import SweepError
    p = os.path.join(out, "cases", case.id, "result.json")
    if not os.path.lexists(p) and not os.path.islink(os.path.dirname(p)):
        return None, None
    try:
        row = check_row(read_result(p), p)
        if (row["id"], row["index"], row["settings"]) != (case.id, case.index, case.settings):
            raise SweepError(f"{p}: the row of case {row['id']} (index {row['index']}), not "
                             f"of {case.id} ({case.describe()})")
    except SweepError as e:
        return None, str(e)
    return row, None
