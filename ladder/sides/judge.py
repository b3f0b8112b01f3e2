"""One parity check as a function call: a port (or its recording) beside the reference.

What the pytest plugin's `ladder_check` and `ladder_fixture` run (ladder/pytest_plugin/), and
what a script can run the same way:

    from ladder.judge import ModelUnderTest, judge
    model = ModelUnderTest.build(preset="tiny", seed=0)      # or params=FILE, cact=FILE
    verdict = judge(my_port, model, prompt_len=6, steps=12)  # a port, "module:factory", a dump
    verdict.passed, verdict.cmp, verdict.location, verdict.obtained
    print(verdict.message())       # first divergence, own/inherited, a short table

The reference of a model is captured once per schedule and kept (`ModelUnderTest.reference`),
so many checks of one model pay for it once. A port is `port.V2Model` (its error split by
re-running its own layer on the reference's inputs), any object of the protocol in
ladder/sides/ports.py, a `module:factory` string, a Ladder, or a recording's path (a trace archive or
a needle-rs stem; split by re-running the reference's layer on the recording's inputs).
"""
from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field

from ladder.engine.trace import Ladder


class JudgeError(ValueError):
    """A check that cannot run as asked (names the value and what is allowed)."""


MODEL_KEYS = ("preset", "seed", "params", "cact", "weights", "bits_map")


@dataclass
class ModelUnderTest:
    """One model both sides run: the port's float32 parameters, the reference's (dequantised
    from the CQ codes when the port computes from them), and the references captured so far."""
    spec: dict
    cfg: object
    params: dict                  # what our port is built from
    ref_params: dict              # what the reference runs on
    src: dict                     # source, file, sha256 (as `run` reports it)
    cactfile: object = None
    references: dict = field(default_factory=dict)
    floors: dict = field(default_factory=dict)

    @classmethod
    def build(cls, preset="tiny", seed=0, params=None, cact=None, weights=None,
              bits_map="embedding=4,mhc=4,default=2", max_memory=None) -> "ModelUnderTest":
        from ladder.sides.model_input import load_model
        ns = argparse.Namespace(preset=preset, seed=int(seed), params=params, cact=cact,
                                max_memory=max_memory)
        p, cfg, src, cactfile = load_model(ns)
        weights = weights or ("cq" if cactfile is not None else "dense")
        if weights not in ("dense", "cq"):
            raise JudgeError(f"weights={weights!r}; one of 'dense', 'cq'")
        ref = p
        if weights == "cq":
            if cactfile is None:
                from reference.cact import build_cact
                cactfile = build_cact(p, cfg, bits_map)
            ref = {k: v.float() for k, v in cactfile.params.items()}
        spec = {"preset": preset, "seed": int(seed), "params": params, "cact": cact,
                "weights": weights, "bits_map": bits_map}
        return cls(spec, cfg, p, ref, src, cactfile)

    @property
    def ref_sha256(self) -> str:
        """params_sha256 of what the reference runs on: the model a recording must be of
        (`dump` writes the same; for CQ weights, the dequantised ones)."""
        if "ref_sha256" not in self.src:
            from ladder.sides.fixtures import params_sha256
            self.src["ref_sha256"] = self.src["sha256"] if self.ref_params is self.params \
                else params_sha256(self.ref_params)
        return self.src["ref_sha256"]

    @property
    def key(self) -> tuple:
        return tuple(self.spec.get(k) for k in MODEL_KEYS)

    def describe(self) -> str:
        s = self.spec
        what = f"params {s['params']}" if s["params"] else f"cact {s['cact']}" if s["cact"] \
            else f"preset {s['preset']} seed {s['seed']}"
        return f"{what}, {s['weights']} weights"

    def tokens(self, n: int, seed=None) -> list:
        from ladder.sides.fixtures import seeded_tokens
        if not 1 <= n <= self.cfg.max_seq_len:
            raise JudgeError(f"{n} positions: the model allows 1..{self.cfg.max_seq_len} "
                             f"(max_seq_len)")
        return seeded_tokens(self.cfg, n, self.spec["seed"] if seed is None else seed)

    def reference(self, tokens, prompt_len: int, window: int) -> Ladder:
        """The reference's ladder on this schedule, captured once and kept."""
        key = (tuple(int(t) for t in tokens), int(prompt_len), int(window))
        if key not in self.references:
            from ladder.sides.capture import capture_reference
            self.references[key] = capture_reference(self.ref_params, self.cfg, list(key[0]),
                                                     prompt_len, window=window,
                                                     label="reference (float32)")
        return self.references[key]

    def floor(self, tokens, prompt_len: int, window: int, precision) -> Ladder:
        """The noise-floor reference at `precision` on this schedule (ladder/sides/
        noise_floor.py), captured once and kept."""
        from ladder.model.precision import Precision
        precision = Precision.parse(precision)
        key = (tuple(int(t) for t in tokens), int(prompt_len), int(window), precision)
        if key not in self.floors:
            from ladder.sides.noise_floor import capture_floor
            self.floors[key] = capture_floor(self.ref_params, self.cfg, list(key[0]),
                                             prompt_len, precision, window=window)
        return self.floors[key]

    def our_port(self, backend="torch", decode="eager", device="cpu", precision=None):
        """port.V2Model on this model's weights (`precision`: port/precision.py's)."""
        from port.model import V2Model
        from ladder.model.precision import Precision
        prec = None if precision is None else Precision.parse(precision)
        if prec is not None and self.spec["weights"] == "cq":
            prec = Precision(prec.activations, "cq", prec.kv)
        arg = None if prec is None else prec.to_json()
        if self.spec["weights"] == "dense":
            return V2Model.from_params(self.params, self.cfg, weights="dense", device=device,
                                       backend=backend, decode=decode, precision=arg)
        return V2Model.from_cactfile(self.cactfile, "cq", device, backend, decode, arg)


def _is_ours(port) -> bool:
    from port.model import V2Model
    return isinstance(port, V2Model)


def _names_a_file(spec: str) -> bool:
    """A string is a recording's path unless it reads as module:factory and no file (or
    needle-rs stem) of that name exists; a path object always is one."""
    return ":" not in spec or os.path.exists(spec) or os.path.exists(spec + ".json")


def _recording(spec: str, model: ModelUnderTest) -> Ladder:
    from ladder.sides.side_spec import LIVE, check_agree, load_side
    if spec in LIVE and not os.path.exists(spec):
        raise JudgeError(f"{spec!r} is not a recording: give a trace archive's path or a "
                         f"needle-rs stem (live sides such as {spec} are `python -m ladder "
                         f"compare`'s)")
    from ladder.formats.foreign import fill_not_emitted
    lad = load_side(spec, argparse.Namespace(max_memory=None, map=None))
    check_agree([(spec, lad)], model.cfg, dict(model.src, sha256=model.ref_sha256))
    fill_not_emitted(lad, model.cfg)
    return lad


def _schedule(model, tokens, prompt_len, steps, seed, recorded: Ladder | None):
    if recorded is not None:
        first = recorded.steps[0]
        rec_prompt = len(first.tokens) if first.name == "prefill" else 1
        if tokens is not None and list(tokens) != recorded.tokens:
            raise JudgeError(f"tokens: the recording holds {recorded.tokens[:8]}..., the check "
                             f"asks for {list(tokens)[:8]}...; a recording is judged on its "
                             f"own tokens (omit tokens=)")
        if prompt_len is not None and prompt_len != rec_prompt:
            raise JudgeError(f"prompt_len={prompt_len}: the recording's prompt is "
                             f"{rec_prompt} positions")
        return recorded.tokens, rec_prompt
    if tokens is not None and steps is not None:
        raise JudgeError(f"tokens= and steps={steps}: give one (steps count the seeded "
                         f"decode steps; tokens are the whole schedule)")
    if prompt_len is None:
        prompt_len = 6
    if not isinstance(prompt_len, int) or prompt_len < 1:
        raise JudgeError(f"prompt_len={prompt_len!r} must be an int >= 1")
    if tokens is None:
        steps = 12 if steps is None else steps
        if not isinstance(steps, int) or steps < 0:
            raise JudgeError(f"steps={steps!r} must be an int >= 0")
        tokens = model.tokens(prompt_len + steps, seed)
    tokens = [int(t) for t in tokens]
    if len(tokens) < prompt_len or len(tokens) > model.cfg.max_seq_len:
        raise JudgeError(f"{len(tokens)} tokens for prompt_len={prompt_len}: need "
                         f"{prompt_len}..{model.cfg.max_seq_len} (max_seq_len)")
    bad = [t for t in tokens if not 0 <= t < model.cfg.vocab_size]
    if bad:
        raise JudgeError(f"token id {bad[0]} outside the model's vocab_size "
                         f"{model.cfg.vocab_size}")
    return tokens, prompt_len


@dataclass
class Captured:
    """The port's ladder over one schedule, and what it ran on."""
    port: object
    obtained: Ladder
    label: str
    tokens: list
    prompt_len: int
    window: int                   # the window both sides step on
    override: int | None          # that window, when it is not the port's make_state()'s
    ours: bool                    # port.V2Model: its own layer can be re-run
    precision: object = None      # what the side declares it computes in (None: float32)


def _rules(rules):
    from ladder.engine.rules import DEFAULT_RULES, RuleSet, load_rules
    if rules is None:
        return DEFAULT_RULES
    return rules if isinstance(rules, RuleSet) else load_rules(os.fspath(rules))


def capture(port, model: ModelUnderTest, *, tokens=None, prompt_len=None, steps=None,
            window=None, seed=None, check_plain=True) -> Captured:
    """Resolve `port` (an object, `module:factory`, a Ladder or a recording's path) and
    record its ladder over the schedule (a recording is its own schedule)."""
    if isinstance(port, os.PathLike) or (isinstance(port, str) and _names_a_file(port)):
        port = _recording(os.fspath(port), model)
    elif isinstance(port, str):
        from ladder.sides.ports import build_port
        port = build_port(port, model.ref_params, model.cfg)     # the reference's weights
    recorded = port if isinstance(port, Ladder) else None
    tokens, prompt_len = _schedule(model, tokens, prompt_len, steps, seed, recorded)
    ours = _is_ours(port)
    if recorded is not None:
        win = recorded.meta.get("kv_window")
        win = model.cfg.kv_window if win is None else win
        if window is not None and window != win:
            raise JudgeError(f"window={window}: the recording stepped on window {win}")
        return Captured(port, recorded, recorded.label or "recording", tokens, prompt_len,
                        win, None, False, recorded.meta.get("precision"))
    from ladder.sides.ports import guarded_call
    made = getattr(guarded_call("the port's make_state()", port.make_state), "window", None)
    if window is None:
        window = made if made is not None else model.cfg.kv_window
    override = None if made == window else window
    if ours:
        from ladder.sides.capture import capture_port
        from ladder.sides.runinfo import describe_port
        label = describe_port(port, model.spec["weights"], port.device, override).label()
        obtained = capture_port(port, tokens, prompt_len, window=override,
                                check_plain=check_plain, label=label)
    else:
        if override is not None:
            raise JudgeError(f"window={window}: the port's make_state() steps on window "
                             f"{made}; a protocol port is judged on its own state")
        from ladder.sides.ports import capture_protocol
        label = f"port {type(port).__module__}.{type(port).__name__}"
        obtained = capture_protocol(port, model.cfg, tokens, prompt_len,
                                    check_plain=check_plain, label=label)
    return Captured(port, obtained, label, tokens, prompt_len, window, override, ours,
                    declared_precision(port))


def declared_precision(port):
    """What a live port declares it computes in: our V2Model's `precision` (port/precision.py),
    or a protocol port's `precision` attribute (a string or dict, ladder/model/precision.py);
    None when it declares nothing (float32)."""
    from ladder.model.precision import Precision, PrecisionError
    p = getattr(port, "precision", None)
    if p is None:
        return None
    if hasattr(p, "to_dict"):
        p = p.to_dict()
    try:
        return Precision.parse(p, "the port's precision attribute")
    except PrecisionError as e:
        raise JudgeError(str(e)) from None


def judge(port, model: ModelUnderTest, *, rules=None, locate=True, precision=None,
          **schedule) -> "Verdict":
    """Capture `port` over the schedule (capture()'s keywords) and compare it with the
    reference; on a divergence, locate it. `precision` overrides what the port declares:
    below float32 it is judged three-way, against a noise floor (docs/precision.md)."""
    return verdict_of(capture(port, model, **schedule), model, rules, locate,
                      precision=precision)


def verdict_of(cap: Captured, model: ModelUnderTest, rules=None, locate=True,
               yardstick: Ladder | None = None, yardstick_label: str | None = None,
               precision=None):
    """Compare a capture with the reference, or with `yardstick` (a stored golden ladder,
    which then stands in for the reference: the reference does not run). A side below
    float32 is compared three-way: the reference, the noise floor at its precision, the side
    (NOISE_RULES unless `rules` are given)."""
    from ladder.engine.compare import compare_ladders
    from ladder.engine.rules import NOISE_RULES, UNIT_EPS
    from ladder.model.precision import Precision
    yard = model.reference(cap.tokens, cap.prompt_len, cap.window) if yardstick is None \
        else yardstick
    prec = Precision.parse(precision if precision is not None else
                           cap.precision if cap.precision is not None else "float32")
    floor = None
    if not prec.is_float32:
        floor = model.floor(cap.tokens, cap.prompt_len, cap.window, prec)
        rules = NOISE_RULES if rules is None else rules
    from ladder.sides.own_error import own_sums
    # each op re-run on the port's inputs: against the reference's ops, so not when a stored
    # golden stands in for the reference (the port is then held to the file, bugs included)
    own = None if yardstick is not None else \
        own_sums(cap.obtained, model.ref_params, model.cfg, prec, cap.window)
    cmp = compare_ladders(cap.obtained, yard, _rules(rules), prefix="port", a_label=cap.label,
                          b_label=yardstick_label or yard.label, floor=floor,
                          unit_eps=UNIT_EPS[prec.activations], precision=prec, own=own)
    cmp.precision, cmp.floor_label = prec, None if floor is None else floor.label
    from ladder.sides.model_input import LadderInputError
    from ladder.sides.side_spec import check_recorded_argmax
    try:                           # a recording's manifest argmax held to its own logits
        check_recorded_argmax(cmp, cap.obtained, yard, [cap.label, cmp.b_label])
    except LadderInputError as e:
        raise JudgeError(str(e)) from None
    loc = None
    if locate and not cmp.passed:
        if floor is not None:               # split at the side's precision (dump_locate.py)
            from ladder.sides.dump_locate import locate_dump
            loc = locate_dump(cmp, cap.obtained, yard, model.ref_params, model.cfg, cap.window,
                              floor=floor, precision=prec)
        elif cap.ours and yardstick is None:
            from ladder.engine.locate import locate as locate_port
            loc = locate_port(cmp, port=cap.obtained, ref=yard, model=cap.port,
                              window=cap.override)
        else:
            from ladder.sides.dump_locate import locate_dump
            loc = locate_dump(cmp, cap.obtained, yard, model.ref_params, model.cfg, cap.window)
    return Verdict(cmp, loc, cap.obtained, yard, model, cap.label, cap.tokens, cap.prompt_len,
                   cap.window)


def save_trace(cap_or_verdict, model: ModelUnderTest, path, precision=None) -> str:
    """A capture's ladder written as a trace archive (ladder/engine/archive.py) with its
    manifest; `precision` (default: what the capture declares, else float32) is recorded as
    the producer's, so a reader judges the file at what it was computed in."""
    from ladder.model.geometry import geometry_of
    from ladder.model.precision import Precision
    c = cap_or_verdict
    declared = getattr(c, "precision", None) or getattr(getattr(c, "cmp", None), "precision",
                                                        None)    # a Captured, or a Verdict
    prec = Precision.parse(precision if precision is not None else declared or "float32")
    return c.obtained.save(
        path, producer={"name": "needle-parity check", "backend": c.label, "dtype": "float32",
                        "precision": prec.text()},
        geometry=geometry_of(model.cfg), kv_window=c.window,
        weights={"source": model.src["source"],
                 "file": model.src.get("file", model.spec["preset"]),
                 "params_sha256": model.ref_sha256},
        prompt_len=c.prompt_len)


@dataclass
class Verdict:
    """What one check found; prints as the failure a reader wants first."""
    cmp: object
    location: object
    obtained: Ladder
    yardstick: Ladder
    model: ModelUnderTest
    label: str
    tokens: list
    prompt_len: int
    window: int
    paths: dict = field(default_factory=dict)      # what save_outputs wrote: {what: path}

    @property
    def passed(self) -> bool:
        return self.cmp.passed

    @property
    def worst(self):
        return self.cmp.worst()

    @property
    def worst_fraction(self) -> float:
        w = self.worst
        return 0.0 if w is None else (math.inf if math.isnan(w.error) else w.error)

    def summary(self) -> dict:
        """A JSON-able line of this check (the plugin's session summary reads these)."""
        w, f = self.worst, self.cmp.first
        own = None if self.location is None else self.location.split
        return {"label": self.label, "yardstick": self.cmp.b_label, "passed": self.passed,
                "points": len(self.cmp.rows), "failing": len(self.cmp.failures),
                "worst_fraction": self.worst_fraction if math.isfinite(self.worst_fraction)
                else "unbounded", "worst_point": w.key if w is not None else None,
                "first_divergence": None if f is None else f.key, "verdict": own,
                "precision": None if self.cmp.precision is None else self.cmp.precision.text(),
                "worst_noise_ratio": None if w is None or math.isnan(w.noise_ratio)
                else w.noise_ratio,
                "systematic": [r.to_dict() for r in self.cmp.systematic
                               if r.failed or r.finding],
                "systematic_tested": sum(r.scale.p == r.scale.p for r in self.cmp.systematic)}

    def save_outputs(self, out_dir, report=True) -> dict:
        """The obtained ladder as a trace archive, and (report) the md/csv/html report."""
        os.makedirs(out_dir, exist_ok=True)
        self.paths["obtained archive"] = save_trace(
            self, self.model, os.path.join(out_dir, "obtained.safetensors"))
        if report:
            from ladder.engine.report import write_report
            paths = write_report(self.cmp, out_dir, self.location,
                                 {"candidate": self.label, "yardstick": self.cmp.b_label,
                                  "model": self.model.describe()}, stem="ladder",
                                 plot_backend="svg")
            self.paths["report"] = paths["html"]
        return self.paths

    def message(self, rows: int = 8) -> str:
        c = self.cmp
        head = (f"ladder parity {'passed' if self.passed else 'FAILED'}: {self.label} vs "
                f"{c.b_label} on {self.model.describe()}; prompt {self.prompt_len} + "
                f"{len(self.tokens) - self.prompt_len} steps, window {self.window}: "
                f"{len(c.rows)} points, {len(c.failures)} failing")
        lines = [head]
        if c.floor_label:
            lines.append(f"judged at {c.precision.short()} in noise units against the "
                         f"{c.floor_label} (docs/precision.md)")
        first = c.first
        if first is not None:
            where = f", layer {first.layer}" if first.layer is not None else ""
            lines.append(f"first divergence: {first.key} (position "
                         f"{first.first_bad_pos}{where}): err "
                         f"{_frac(first.first_bad_error)} of allowance, max|a-b| "
                         f"{first.max_abs:.3g} [{first.pattern}: {first.rule.describe()}]")
            if self.location is not None and self.location.verdict:
                lines.append(f"layer verdict: {self.location.verdict}")
            lines.append(f"first failing rows (of {len(c.failures)}):")
            lines.append(f"  {'step/point':24s} {'err/allow':>10s} {'max|a-b|':>10s} "
                         f"{'first pos':>9s}")
            for r in c.failures[:rows]:
                lines.append(f"  {r.key:24s} {_frac(r.first_bad_error):>10s} "
                             f"{r.max_abs:10.3g} {r.first_bad_pos!s:>9s}")
        w = self.worst
        if w is not None:
            lines.append(f"worst: {w.key} at {_frac(w.error)} of its allowance")
        for what, p in self.paths.items():
            lines.append(f"{what}: {p}")
        return "\n".join(lines)

    def __str__(self):
        return self.message()


def _frac(x: float) -> str:
    from ladder.engine.compare import error_text
    return error_text(x)
