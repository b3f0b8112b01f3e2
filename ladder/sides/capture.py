"""Run each side over a token schedule and record its ladder (see trace.py for the layout).

Both runners can also prove that tracing changed nothing: the same schedule run plainly
(`forward_cached(trace=None)`; the port's `prefill_batch` + `step`) must give the same logits
and caches bit for bit, or TraceError names the step (docs/design.md: checked before any fixture
is written, and by `python -m ladder run`). On the port a difference is first located: its
plain paths are re-run traced (`locate_path`), and PathError names the path, point and layer
where they part from the one-position ladder.

Every ladder recorded here is held to the point registry (ladder/model/points.py) before it is
returned: the same names, order and shapes from every implementation.
"""
from __future__ import annotations

import torch

from reference.decode import COARSE, forward_cached, init_kv_cache
from ladder.model.names import layer_of, point_name
from ladder.model import points
from ladder.model.points import check_native_captures, expected
from ladder.engine.trace import (TAIL, Ladder, PortRecorder, ReferenceRecorder, TraceError, copy_values,
                                 schedule)



def check_ladder(ladder, cfg, keep=None) -> None:
    """The registry's check of a captured ladder (ladder/model/points.py), after holding the
    reference's coarse ladder (reference.decode.COARSE) to the registry's."""
    points.check_coarse(COARSE)
    points.check_ladder(ladder, cfg, keep)

def capture_reference(params, cfg, tokens, prompt_len: int, *, window=None, keep=None,
                      check_plain: bool = False, progress=None, label="reference",
                      kv_store=None) -> Ladder:
    """forward_cached: one prefill call, then one call per decode step, Engram history = the
    whole token list (valid everywhere), as generation sees it. `kv_store`: the cache's
    format (the noise-floor reference's, ladder/sides/noise_floor.py)."""
    steps = schedule(tokens, prompt_len)
    toks = torch.tensor([[int(t) for t in tokens]], dtype=torch.int64)
    N = toks.shape[1]
    dtype = params["embedding/embedding"].dtype
    valid = torch.ones(1, N, dtype=torch.bool)
    ladder = Ladder(steps, label=label)
    kc, vc = init_kv_cache(cfg, 1, N, dtype)
    pk, pv = kc, vc
    for st in steps:
        sl = toks[:, st.pos:st.pos + len(st.tokens)]
        kw = dict(kv_window=window, hist=toks, hist_valid=valid, kv_store=kv_store)
        lg, kc, vc = forward_cached(params, cfg, sl, kc, vc, st.pos,
                                    trace=ReferenceRecorder(ladder, st, keep=keep), **kw)
        if check_plain:
            plain, pk, pv = forward_cached(params, cfg, sl, pk, pv, st.pos, **kw)
            if not (torch.equal(plain, lg) and torch.equal(pk, kc) and torch.equal(pv, vc)):
                raise TraceError(f"{label}: the traced run differs from the plain run at "
                                 f"step {st.name}: tracing must not change a bit")
        if progress is not None:
            progress.update(len(st.tokens))
    check_ladder(ladder, cfg, keep)
    return ladder


def capture_port(model, tokens, prompt_len: int, *, window=None, keep=None,
                 check_plain: bool = False, progress=None, label="port") -> Ladder:
    """The port one position at a time through `step_traced` (prefill positions too, so each
    is captured); with check_plain, the same tokens through `prefill_batch` and `step`. Both
    run on `model.make_state()`, the state users get; `window` narrows its attention window
    (an explicit override, e.g. `--window`), None keeps make_state()'s."""
    from port.batch import V2Batch
    if model.impl.capture_table is not None:
        check_native_captures(model.impl.capture_table)
    steps = schedule(tokens, prompt_len)
    ladder = Ladder(steps, label=label)
    state = model.make_state()
    plain = model.make_state() if check_plain else None
    if window is not None:
        state.set_kv_window(window, model)
        if plain is not None:
            plain.set_kv_window(window, model)
    hideable = getattr(model, "hidden_points", {})
    for st in steps:
        rec = PortRecorder(ladder, st, keep=keep)
        prefill = st.name == "prefill"      # traced as prefill_batch computes it
        for tok in st.tokens:
            rec.next_position()
            model.step_traced(int(tok), state, None, rec, prefill=prefill)
            if progress is not None:
                progress.update()
        rec.finish()
        if hideable:
            note_hidden(ladder, st, model.cfg, hideable, keep)
        if plain is not None:
            traced = state.logits
            if st.name == "prefill":
                got = model.prefill_batch(list(st.tokens), plain, V2Batch(model),
                                          torch.empty_like(traced))
            else:
                got = model.step(int(st.tokens[0]), plain)
            if not torch.equal(got, traced):
                locate_path(model, steps, window, keep, ladder, label, st.name, got)
                raise TraceError(f"{label}: step_traced logits differ from the plain "
                                 f"{'prefill_batch' if st.name == 'prefill' else 'step'} "
                                 f"at step {st.name}: tracing must not change a bit" +
                                 _untraced(model, st.name))
    if plain is not None:
        for name in ("k", "v", "vraw", "lanes", "hidden"):
            if not torch.equal(getattr(plain, name), getattr(state, name)):
                locate_path(model, steps, window, keep, ladder, label, steps[-1].name)
                raise TraceError(f"{label}: state.{name} after the traced run differs from "
                                 f"the plain run's" + _untraced(model, steps[-1].name))
    check_ladder(ladder, model.cfg, keep)
    prec = getattr(model, "precision", None)
    if prec is not None and not prec.is_float32:       # port/precision.py: what it ran at
        from ladder.model.precision import Precision
        ladder.meta["precision"] = Precision.parse(prec.to_dict())
    return ladder


def note_hidden(ladder: Ladder, st, cfg, hideable: dict, keep=None,
                prefix: str = "fused: ") -> None:
    """Registry points the step did not trace that the model declares hidden by fusion
    (`model.hidden_points`: per-layer name -> the kernel holding it) go to `ladder.hidden`
    with that reason (after `prefix`; a foreign port's reason stands as it gives it); any
    other missing point is left for check_ladder to refuse."""
    got = set(ladder.points(st.name))
    for name, _ in expected(cfg):
        base = name.split(".", 1)[1] if "." in name else name
        why = hideable.get(name, hideable.get(base))     # a full name, else the per-layer one
        if name not in got and why is not None and (keep is None or keep(name)):
            ladder.hidden[f"{st.name}/{name}"] = f"{prefix}{why}"


class PathError(TraceError):
    """A plain path of the port (`prefill_batch`, the decode body) parts from the one-position
    `step_traced` the ladder records: names the path, the step, point and position."""

    def __init__(self, msg, path, step, point, position):
        super().__init__(msg)
        self.path, self.step, self.point, self.position = path, step, point, position


class BatchRecorder:
    """A trace for a traced `prefill_batch` (`batched`: one call per point per chunk with the
    chunk's rows [m, ...]): rows of every chunk in order, and the tail points (lane_mean,
    final_norm, logits), which a batched forward has for its last row only."""
    batched = True

    def __init__(self, keep=None):
        self.keep, self.rows, self.tail = keep, {}, {}

    def __call__(self, name, layer, values):
        point = point_name(name, layer)
        if self.keep is not None and not self.keep(point):
            return
        if layer is None and name in TAIL:
            self.tail[point] = copy_values(values, None)
        else:
            self.rows.setdefault(point, []).append(copy_values(values, None))

    def at(self, point: str, j: int, S: int):
        """Row j (of S) of `point`, or None where the batched forward has no such value."""
        if point in self.tail:
            return self.tail[point] if j == S - 1 else None
        if point not in self.rows:
            return None
        rows = torch.cat(self.rows[point])
        return rows[j] if j < rows.shape[0] else None


# The paths `capture_port(check_plain=True)` runs plainly, as its messages name them.
PREFILL_PATH = ("prefill_batch", "the batched prefill path (port/batch.py: V2Model.rows over "
                "a chunk of positions)")
BODY_PATH = ("the decode body", "the decode body path (port/graph.py: DecodeGraph prep + "
             "body, the step `--decode graph` and the triton backend run)")


def _untraced(model, step: str) -> str:
    """Why the located comparison could not run (appended to the plain-check message)."""
    if step == "prefill" and not model.impl.traces_batch:
        return (" (the native C step traces only a call's first row, so prefill_batch could "
                "not be compared point by point)")
    if step != "prefill" and model.impl.graph_replay:
        return (" (or the CUDA graph replay: the decode body, traced eagerly, agrees with "
                "step_traced at every point)")
    return ""


def locate_path(model, steps, window, keep, ladder: Ladder, label: str, upto: str,
                plain_logits=None) -> None:
    """The plain paths traced from a fresh state through step `upto`: `prefill_batch` (every
    chunk row), then each decode step the way `step` runs it (the decode body where the model
    uses one, `run_step` otherwise), compared bit for bit with the one-position
    `step_traced` ladder. PathError at the first point that differs; returns when none does
    (then tracing itself, or a CUDA graph replay, is what differs). `plain_logits`: the
    untraced path's logits at `upto`, to say whether tracing the path changed it too."""
    from port.batch import V2Batch
    state = model.make_state()
    if window is not None:
        state.set_kv_window(window, model)
    first = None
    for st in steps:
        S = len(st.tokens)
        if st.name == "prefill":
            if not model.impl.traces_batch:
                return
            rec = BatchRecorder(keep)
            out = model.prefill_batch(list(st.tokens), state, V2Batch(model),
                                      torch.empty_like(state.logits), trace=rec)
            path, at = PREFILL_PATH, lambda p, j: rec.at(p, j, S)
        else:
            tok = int(st.tokens[0])
            body = model.uses_body(state) and state.pos > 0
            one = Ladder([st])
            prec = PortRecorder(one, st, keep=keep)
            prec.next_position()
            if body:
                model.check_step(tok, state)
                out = state.decode_graph(model).step(tok, trace=prec)
            else:
                out = model.run_step(tok, state, trace=prec)
            prec.finish()
            path = BODY_PATH if body else ("step", "the plain step")
            at = lambda p, j, one=one, st=st: (one.values[f"{st.name}/{p}"][j]
                                              if f"{st.name}/{p}" in one.values else None)
        for point in ([] if first else ladder.points(st.name)):
            want = ladder[f"{st.name}/{point}"]
            tail = st.name == "prefill" and point in TAIL     # the batch's last row only
            for j in range(S - 1 if tail else 0, S):
                got = at(point, j)
                if got is None and not tail:
                    continue                    # not a point this path has (hidden by fusion)
                if got is not None and torch.equal(got, want[j]):
                    continue
                first = (path, st, point, j)
                break
            if first:
                break
        if st.name == upto:
            break
    if first is None:
        return
    path, st, point, j = first
    lay = layer_of(point)
    where = f"{st.name}/{point} position {st.pos + j}" + ("" if lay is None else
                                                            f" (layer {lay})")
    same = plain_logits is not None and torch.equal(out.to(plain_logits.device), plain_logits)
    why = ("traced, it gives its plain run's logits bit for bit: tracing is not at fault"
           if same else "traced, it shows the difference too")
    raise PathError(f"{label}: {path[0]} differs from the one-position step_traced at "
                    f"{where}: {path[1]} is at fault ({why})", path[0], st.name, point,
                    st.pos + j)
