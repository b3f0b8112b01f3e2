"""In-process ports: anything in the seed's shape, loaded by `--port module:factory`.

The protocol (README "Bring your own port"), what `port.V2Model` also implements:

    port = factory(params, cfg)          # params: {flax path: float32 tensor}; cfg: V2Config
    state = port.make_state()
    logits = port.step_traced(token, state, logits, trace)
        # one token at the state's next position; `logits` a buffer to fill or None;
        # trace(name, layer, values): one call per registry point, layer None for
        # whole-forward points, values that position's tensor (the registry's shape)
    optional:
    port.step(token, state, logits=None)   # the plain step: must give the same bits
    port.hidden_points = {name: why}       # points the port cannot show (never a silent pass):
                                           # a per-layer name (h_in: every layer) or a full one
                                           # (L00.h_in: that layer); whole-forward names as-is

A port need not implement injection (`step_layer`): `locate` then re-runs the *reference's*
layer from the port's own recorded inputs (ladder/sides/dump_locate.py), as it does for a dump.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import signal
import threading

import torch

from ladder.model.names import TraceError
from ladder.engine.trace import Ladder, PortRecorder, schedule


class PortLoadError(ValueError):
    """--port that cannot be imported or built, or does not speak the protocol."""


REQUIRED = ("make_state", "step_traced")


def load_factory(spec: str):
    """`module:factory` -> the callable (PortLoadError names what is missing)."""
    mod, sep, attr = str(spec).partition(":")
    if not sep or not mod or not attr:
        raise PortLoadError(f"--port {spec!r}: give module:factory (e.g. my_port:build)")
    try:
        m = importlib.import_module(mod)
    except ImportError as e:
        raise PortLoadError(f"--port {spec}: cannot import {mod!r}: {e}") from None
    obj = m
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PortLoadError(f"--port {spec}: module {mod!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise PortLoadError(f"--port {spec}: {attr!r} is not callable")
    try:                    # a callable that cannot take (params, cfg) is no factory
        sig = inspect.signature(obj)
    except (TypeError, ValueError):     # some builtins do not say: found out when called
        return obj
    try:
        sig.bind(None, None)
    except TypeError:
        raise PortLoadError(f"--port {spec}: a factory is called as factory(params, cfg); "
                            f"{attr!r} takes {sig}") from None
    return obj


@contextlib.contextmanager
def time_limit(seconds, what: str):
    """PortLoadError when the block runs past `seconds` (--port-timeout; None: no limit). A
    SIGALRM timer, so only in the main thread of a Unix process; elsewhere the block runs
    unbounded (the plugin's tests, under pytest's own timeouts)."""
    if not seconds or threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "setitimer"):
        yield
        return

    def expired(signum, frame):
        raise PortLoadError(f"{what} did not return within {seconds:g} s (--port-timeout)")
    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def guarded_call(what: str, fn, *args, timeout=None):
    """fn(*args), with any exception of the port's own code reported as PortLoadError naming
    `what` (a traceback from someone else's port is not ours to print); the harness's own
    errors (TraceError from the recorder, PortLoadError) pass through."""
    try:
        with time_limit(timeout, what):
            return fn(*args)
    except (TraceError, PortLoadError):
        raise
    except Exception as e:          # noqa: BLE001 (the port's code may raise anything)
        raise PortLoadError(f"{what} raised {type(e).__name__}: {str(e)[:300]}") from None


def build_port(spec: str, params: dict, cfg, timeout=None):
    factory = load_factory(spec)
    port = guarded_call(f"--port {spec}: its factory", factory, params, cfg, timeout=timeout)
    missing = [n for n in REQUIRED if not callable(getattr(port, n, None))]
    if missing:
        raise PortLoadError(f"--port {spec}: the object its factory returned lacks "
                            f"{missing[0]}() (the protocol needs {', '.join(REQUIRED)})")
    return port


def hidden_points(port, cfg, label: str = "port") -> dict:
    """The port's `hidden_points` as {per-layer or full registry name: why}; a key that is
    neither (a typo, another model's point) is refused naming it and the spellings allowed."""
    from ladder.model.points import expected
    given = getattr(port, "hidden_points", None) or {}
    if not isinstance(given, dict):
        raise PortLoadError(f"{label}: hidden_points is a {type(given).__name__}; give a dict "
                            f"{{point name: why it cannot be traced}}")
    full = [n for n, _ in expected(cfg)]
    known = set(full) | {n.split(".", 1)[1] for n in full if "." in n}
    for name, why in given.items():
        if not isinstance(name, str) or name not in known:
            bare = sorted({n.split(".", 1)[1] for n in full if "." in n})
            raise PortLoadError(f"{label}: hidden_points key {name!r} is not a registry point "
                                f"of this model; give a per-layer name ({', '.join(bare[:6])}, "
                                f"...: every layer), a full name (L00.h_in: one layer) or a "
                                f"whole-forward one (`python -m ladder points` lists them)")
        if not isinstance(why, str):
            raise PortLoadError(f"{label}: hidden_points[{name!r}] is a {type(why).__name__}; "
                                f"give why the point cannot be traced, as a string")
    return dict(given)


def capture_protocol(port, cfg, tokens, prompt_len: int, *, check_plain: bool = False,
                     progress=None, label: str = "port", timeout=None) -> Ladder:
    """Every position through `step_traced`, recorded as a Ladder checked against the
    registry; with check_plain and a `step`, the plain step must give the same logits."""
    from ladder.sides.capture import note_hidden
    from ladder.sides.capture import check_ladder
    steps = schedule(tokens, prompt_len)
    ladder = Ladder(steps, label=label)
    state = guarded_call(f"{label}: make_state()", port.make_state, timeout=timeout)
    plain = guarded_call(f"{label}: make_state()", port.make_state, timeout=timeout) \
        if check_plain and callable(getattr(port, "step", None)) else None
    hideable = hidden_points(port, cfg, label)
    for st in steps:
        rec = PortRecorder(ladder, st)
        for tok in st.tokens:
            rec.next_position()
            at = f"{label}: step_traced at {st.name} (token {tok})"
            got = guarded_call(at, port.step_traced, int(tok), state, None, rec, timeout=timeout)
            if plain is not None:
                want = guarded_call(f"{label}: step at {st.name} (token {tok})", port.step, int(tok),
                             plain, timeout=timeout)
                if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
                        and torch.equal(got, want)):
                    raise TraceError(f"{label}: step_traced logits differ from the plain step "
                                     f"at {st.name} (token {tok}): tracing must not change a bit")
            if progress is not None:
                progress.update()
        rec.finish()
        if hideable:
            note_hidden(ladder, st, cfg, hideable, prefix="")
    try:
        check_ladder(ladder, cfg)
    except TraceError as e:     # the port's trace breaks the protocol: its mistake, not a divergence
        raise PortLoadError(f"{e}; a port traces every registry point (`python -m ladder "
                            f"points`) or names it in hidden_points") from None
    declared = getattr(port, "precision", None)     # the protocol's optional attribute
    if declared is not None:
        from ladder.model.precision import Precision, PrecisionError
        try:
            ladder.meta["precision"] = Precision.parse(
                declared.to_dict() if hasattr(declared, "to_dict") else declared,
                f"{label}: its precision attribute")
        except PrecisionError as e:
            raise PortLoadError(str(e)) from None
    return ladder
