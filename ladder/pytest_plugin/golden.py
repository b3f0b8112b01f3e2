"""Golden fixtures: a port's ladder stored as a trace archive and checked against later runs.

pytest-regressions' semantics (what `ladder_fixture` in ladder/pytest_plugin/ runs):

    stored file      regen=None             regen="failing"            regen="all"
    missing          write it, FAIL         write it, FAIL             write it, pass
    disagrees*       FAIL (says why)        rewrite it, FAIL           rewrite it, pass
    compares, fails  FAIL (first diverg.)   rewrite it, FAIL           rewrite it, pass
    compares, passes pass                   pass (untouched)           rewrite it, pass

    * unreadable, or recorded on another model, geometry or schedule than the check asks for

A path that is a directory, a symbolic link or another non-regular file fails whatever the
flags, and is never replaced.

A failing test after a rewrite is the point: the change is seen, then committed. The stored
ladder stands in for the reference (which does not run); the rules are the check's own.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ladder.sides.judge import JudgeError, capture, save_trace, verdict_of


@dataclass
class GoldenOutcome:
    path: str
    failed: bool
    action: str                 # "compared", "created", "rewritten"
    why: str = ""               # what made a rewrite or a failure necessary
    verdict: object = None      # the comparison against the stored ladder, when one ran
    stand_in: object = None     # StandInCheck: the stored file against the reference

    def message(self) -> str:
        name = os.path.basename(self.path)
        if self.stand_in is not None and self.stand_in.stale:
            # the layer split against a wrong file would blame the port: not shown
            head = (f"ladder_fixture {name}: regenerated {self.path}; the test fails so the "
                    f"change is seen" if self.action == "rewritten" else
                    f"ladder_fixture {name}: --ladder-regen rewrites {self.path}")
            return head + "\n" + self.stand_in.message()
        if self.action == "created":
            return (f"ladder_fixture {name}: no stored fixture; wrote {self.path} from this "
                    f"run (check it in; the next run compares against it)")
        lines = []
        if self.action == "rewritten":
            lines.append(f"ladder_fixture {name}: regenerated {self.path} ({self.why}); the "
                         f"test fails so the change is seen (--ladder-regen-all passes)")
        elif self.why.startswith("is "):
            lines.append(f"ladder_fixture {name}: {self.path} {self.why}")
        elif self.why:
            lines.append(f"ladder_fixture {name}: the stored fixture {self.path} {self.why}; "
                         f"--ladder-regen rewrites it")
        else:
            lines.append(f"ladder_fixture {name}: the run does not match {self.path}; "
                         f"--ladder-regen rewrites it if the change is intended")
        if self.verdict is not None and not self.verdict.passed:
            lines.append(self.verdict.message())
        return "\n".join(lines)


def disagreement(stored, cap, model, run_precision) -> str:
    """Why `stored` is not a recording of this check ("" when it is); `run_precision`: the
    Precision the run computes at."""
    from ladder.model.geometry import geometry_mismatch, geometry_of
    meta = stored.meta
    bad = geometry_mismatch(meta.get("geometry") or {}, geometry_of(model.cfg))
    if bad:
        return f"was recorded on geometry {bad[0]}={bad[1]!r}, this model has {bad[2]!r}"
    sha = (meta.get("weights") or {}).get("params_sha256")
    if sha is not None and not isinstance(sha, str):
        return f"cannot be read (weights.params_sha256 is {type(sha).__name__}, not a string)"
    if sha and sha != model.ref_sha256:
        return (f"was recorded on parameters {sha}, this model's are "
                f"{model.ref_sha256} ({model.describe()})")
    if stored.tokens != cap.tokens:
        i = next((i for i, (a, b) in enumerate(zip(stored.tokens, cap.tokens)) if a != b),
                 min(len(stored.tokens), len(cap.tokens)))
        return f"holds other tokens (first difference at position {i}; {len(stored.tokens)} " \
               f"positions stored, {len(cap.tokens)} run)"
    if [(s.pos, len(s.tokens)) for s in stored.steps] != \
            [(s.pos, len(s.tokens)) for s in cap.obtained.steps]:
        return "holds another step schedule (prompt length)"
    if meta.get("kv_window") is not None and meta["kv_window"] != cap.window:
        return f"was recorded at window {meta['kv_window']}, this run's is {cap.window}"
    stored_prec = meta.get("precision")
    if stored_prec is not None and stored_prec != run_precision:
        # judged at the run's precision against a file declaring another, a float16 golden
        # would pass a bfloat16 run on the wider floor: the declaration must match
        return (f"was recorded at {stored_prec.short()} (producer.precision "
                f"{stored_prec.text()!r}), this run computes at {run_precision.short()} "
                f"({run_precision.text()!r})")
    return _unreadable_logits(stored)


def _unreadable_logits(stored) -> str:
    """A stored step's logits holding NaN/Inf cannot be the argmax its manifest records:
    the file is damaged, not a port's recording ("" when every step's logits are finite)."""
    import torch
    for st in stored.steps:
        key = f"{st.name}/logits"
        if "logits" in stored.points(st.name) and not bool(torch.isfinite(stored[key]).all()):
            return (f"cannot be read ({key} holds NaN or Inf: stored logits are finite "
                    f"numbers, the argmax its manifest records)")
    return ""


def check_golden(port, model, path: str, regen: str | None, schedule: dict) -> GoldenOutcome:
    """Run the port and judge it against the stored ladder at `path` (see the table above)."""
    if regen not in (None, "failing", "all"):
        raise ValueError(f"regen={regen!r}; one of None, 'failing', 'all'")
    from ladder.engine.archive import ArchiveError
    from ladder.engine.trace import Ladder
    from ladder.model.precision import Precision
    rules, locate = schedule.pop("rules", None), schedule.pop("locate", True)
    declared = schedule.pop("precision", None)
    if os.path.lexists(path) and (os.path.islink(path) or not os.path.isfile(path)):
        # never replaced: something a person put there, not a file this plugin wrote
        kind = "a symbolic link" if os.path.islink(path) else \
            "a directory" if os.path.isdir(path) else "not a regular file"
        return GoldenOutcome(path, True, "compared", f"is {kind}; golden fixtures are regular "
                                                     f"files (remove it to have one written)")
    cap = capture(port, model, **schedule)
    # what the run computes at: --ladder-precision, else what the port declares
    prec = Precision.parse(declared if declared is not None else
                           cap.precision if cap.precision is not None else "float32")
    if not os.path.isfile(path):
        save_trace(cap, model, path, prec)
        return GoldenOutcome(path, regen != "all", "created", "no stored fixture")
    try:
        stored = Ladder.load(path)
        why = disagreement(stored, cap, model, prec)
    except (ArchiveError, OSError) as e:
        stored, why = None, f"cannot be read ({e})"
    verdict = stand_in = None
    if not why:
        try:
            verdict = verdict_of(cap, model, rules, locate, yardstick=stored,
                                 yardstick_label=f"fixture {os.path.basename(path)}",
                                 precision=prec)
        except JudgeError as e:          # the file contradicts itself (its argmax, ...)
            verdict, why = None, f"cannot be read ({e})"
    if verdict is not None:
        if verdict.passed and regen != "all":
            return GoldenOutcome(path, False, "compared", "", verdict)
        if not verdict.passed:
            stand_in = _against_reference(stored, cap, model, verdict.cmp.rules, path)
    if regen is None:
        return GoldenOutcome(path, True, "compared", why, verdict, stand_in)
    save_trace(cap, model, path, prec)
    reason = why or ("requested (--ladder-regen-all)" if verdict.passed else
                     f"{len(verdict.cmp.failures)} points failed")
    return GoldenOutcome(path, regen == "failing", "rewritten", reason, verdict, stand_in)


def _against_reference(stored, cap, model, rules, path):
    """The stored ladder held to the reference recomputed on its schedule (ladder/engine/stand_in.py):
    a failure may be the file's, not the port's."""
    from ladder.engine.stand_in import check_stand_in
    ref = model.reference(cap.tokens, cap.prompt_len, cap.window)
    return check_stand_in(stored, cap.obtained, ref, rules,
                          f"golden file {os.path.basename(path)}", "--ladder-regen")
