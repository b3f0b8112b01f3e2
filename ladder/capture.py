"""Run each side over a token schedule and record its ladder (see trace.py for the layout).

Both runners can also prove that tracing changed nothing: the same schedule run plainly
(`forward_cached(trace=None)`; the port's `prefill_batch` + `step`) must give the same logits
and caches bit for bit, or TraceError names the step (docs/design.md: checked before any fixture
is written, and by `python -m ladder run`).

Every ladder recorded here is held to the point registry (ladder/points.py) before it is
returned: the same names, order and shapes from every implementation.
"""
from __future__ import annotations

import torch

from reference.decode import forward_cached, init_kv_cache
from .points import check_ladder, check_native_captures, expected
from .trace import Ladder, PortRecorder, ReferenceRecorder, TraceError, schedule


def capture_reference(params, cfg, tokens, prompt_len: int, *, window=None, keep=None,
                      check_plain: bool = False, progress=None, label="reference") -> Ladder:
    """forward_cached: one prefill call, then one call per decode step, Engram history = the
    whole token list (valid everywhere), as generation sees it."""
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
        kw = dict(kv_window=window, hist=toks, hist_valid=valid)
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
    if model.backend == "native":
        from kernels import native
        check_native_captures(native.CAPTURES)
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
                raise TraceError(f"{label}: step_traced logits differ from the plain "
                                 f"{'prefill_batch' if st.name == 'prefill' else 'step'} "
                                 f"at step {st.name}: tracing must not change a bit")
    if plain is not None:
        for name in ("k", "v", "vraw", "lanes", "hidden"):
            if not torch.equal(getattr(plain, name), getattr(state, name)):
                raise TraceError(f"{label}: state.{name} after the traced run differs from "
                                 f"the plain run's")
    check_ladder(ladder, model.cfg, keep)
    return ladder


def note_hidden(ladder: Ladder, st, cfg, hideable: dict, keep=None) -> None:
    """Registry points the step did not trace that the model declares hidden by fusion
    (`model.hidden_points`: per-layer name -> the kernel holding it) go to `ladder.hidden`
    with that reason; any other missing point is left for check_ladder to refuse."""
    got = set(ladder.points(st.name))
    for name, _ in expected(cfg):
        base = name.split(".", 1)[1] if "." in name else name
        if name not in got and base in hideable and (keep is None or keep(name)):
            ladder.hidden[f"{st.name}/{name}"] = f"fused: {hideable[base]}"
