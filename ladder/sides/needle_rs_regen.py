"""needle-rs's fixture regenerated from our reference: greedy decoding as needle-rs's own
generator runs it, recorded in float64 and rounded once to float32, written in its format
(ladder/formats/needle_rs.py). The writer of that format lives there; this is the side that
runs the reference for it.
"""
from __future__ import annotations

import torch

from ladder.engine.trace import Ladder


def build(params, cfg, prompt_ids: list, steps: int, *, window=None, eos_id=None,
          progress=None) -> tuple:
    """(ladder, generated ids): greedy decoding from `prompt_ids` on the reference, as
    needle-rs's generator runs it (each decode step feeds the previous step's argmax; stop at
    `eos_id`), recorded in float64 and rounded once to float32 (ladder/sides/fixtures.py says why).
    TraceError if a rounded step's argmax is not the token fed next (a float32 near tie)."""
    from reference.decode import generate
    from ladder.sides.capture import capture_reference
    p64 = {k: v.double() for k, v in params.items()}
    win = cfg.kv_window if window is None else int(window)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                 # one reduction order, whatever the machine
    try:
        gen = generate(p64, cfg, prompt_ids, steps, kv_window=win,
                       max_len=min(cfg.max_seq_len, len(prompt_ids) + steps), eos_id=eos_id)
        lad = capture_reference(p64, cfg, list(prompt_ids) + gen, len(prompt_ids), window=win,
                                check_plain=True, progress=progress, label="reference float64")
    finally:
        torch.set_num_threads(threads)
    out = Ladder(lad.steps, {k: v.float() for k, v in lad.values.items()}, "reference")
    for st, nxt in zip(out.steps, gen):
        got = int(torch.argmax(out.values[f"{st.name}/logits"][-1]))
        if got != nxt:
            from ladder.model.names import TraceError
            raise TraceError(f"step {st.name}: the float32-rounded logits' argmax {got} is not "
                             f"the greedy token {nxt} (a near tie); choose another prompt")
    return out, gen
