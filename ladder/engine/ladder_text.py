"""Readings of a pair of ladders that involve no tolerance: the order their points are
compared in (`merged_order`), the points one side could not show (`hidden_text`, a
Comparison's line), and the first value that is not bit-identical (`first_bit_difference`,
the oracle of "where does a change first show")."""
from __future__ import annotations

import torch

from ladder.engine.trace import Ladder, layer_of


def merged_order(a: Ladder, b: Ladder, step: str) -> list:
    """The reference's points in its order, with points only the candidate traces inserted
    after the last common point before them in the candidate's order."""
    order = list(b.points(step))
    have = set(order)
    last = None
    for p in a.points(step):
        if p in have:
            last = p
        else:
            order.insert(order.index(last) + 1 if last is not None else 0, p)
            have.add(p)
            last = p
    return order


def hidden_text(hidden: list) -> str:
    """One line naming the points a run could not show (a fused kernel kept them, another
    implementation does not emit them): the steps and layers they are missing from, and the
    names grouped by reason."""
    by_why, steps, layers = {}, set(), set()
    for key, why in hidden:
        step, point = key.split("/", 1)
        steps.add(step)
        if layer_of(point) is not None:
            layers.add(layer_of(point))
        names = by_why.setdefault(why, [])
        base = point.split(".", 1)[-1]
        if base not in names:
            names.append(base)
    where = f"{len(steps)} step(s)" + (f" x {len(layers)} layer(s)" if layers else "")
    title = "hidden by fusion (not compared)" if all(w.startswith("fused") for w in by_why) \
        else "not compared"
    return (f"{title}, {len(hidden)} points over {where}: "
            + "; ".join(f"{', '.join(n)} ({w})" for w, n in by_why.items()))


def first_bit_difference(a: Ladder, b: Ladder):
    """(step, point, absolute position) of the first value that is not bit-identical, in
    `b`'s ladder order; None when the ladders are equal bit for bit. The oracle for
    "where does a change first show" that involves no tolerance at all."""
    for st in b.steps:
        for point in merged_order(a, b, st.name):
            key = f"{st.name}/{point}"
            if (key not in a and key in a.hidden) or (key not in b and key in b.hidden):
                continue                                 # fused away on one side
            if key not in a or key not in b or a[key].shape != b[key].shape:
                return st.name, point, st.pos
            for j in range(a[key].shape[0]):
                if not torch.equal(a[key][j], b[key][j]):
                    return st.name, point, st.pos + j
    return None
