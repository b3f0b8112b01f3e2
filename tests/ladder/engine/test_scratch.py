"""The batched pass's reused work arrays (ladder/engine/scratch.py): nothing a chunk computed
changes when the next chunk reuses them, threads do not share them, what is held is bounded;
and the arithmetic rewritten around them (batch._ulp_max, segmented_sums' narrow count)
gives the bits of the plain forms."""
import threading

import numpy as np
import pytest

from ladder.engine import batch, scratch
from ladder.engine.metrics import _ulps
from ladder.engine.rules import DEFAULT_RULES
from ladder.engine.systematic_sums import MOVED, TOWARD, segmented_sums


def _pairs(seed, n_points=5, S=3, width=700):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_points):
        b = (rng.standard_normal((S, width)) * 10.0 ** rng.integers(-3, 3)).astype(np.float32)
        a = (b * (1 + rng.standard_normal(b.shape) * 1e-6)).astype(np.float32)
        out.append((a, b))
    return out


def _read(m):
    """Everything a Measured answers, as plain values."""
    return ([m.metrics(i) for i in range(len(m))], [m.errors(i) for i in range(len(m))],
            m.bad, m._sums.copy())


def _measure(pairs):
    rule = DEFAULT_RULES.rules[DEFAULT_RULES.pattern_for("port/L00.x")]
    return batch.measure(pairs, [rule] * len(pairs), DEFAULT_RULES.rel_floor)[1]


def test_a_later_chunk_does_not_change_what_an_earlier_one_measured():
    first = _measure(_pairs(0))
    before = _read(first)
    _measure(_pairs(1, n_points=7, width=900))       # reuses (and grows) every work array
    after = _read(first)
    assert repr(after[:3]) == repr(before[:3])
    assert np.array_equal(after[3], before[3])
    # and a fresh measure of the first chunk gives the same answers again
    assert repr(_read(_measure(_pairs(0)))[:3]) == repr(before[:3])


def test_threads_measuring_at_once_get_the_serial_answers():
    seeds = range(6)
    serial = {s: repr(_read(_measure(_pairs(s)))[:3]) for s in seeds}
    got, errors = {}, []

    def work(s):
        try:
            for _ in range(5):
                got.setdefault(s, set()).add(repr(_read(_measure(_pairs(s)))[:3]))
        except Exception as e:                      # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(got[s] == {serial[s]} for s in seeds)


def test_what_a_thread_holds_is_bounded_by_the_limit():
    def run():
        scratch.take("big", scratch.LIMIT + 1)      # one point larger than any chunk
        scratch.take("small", 1000)
        held.append(scratch.held_bytes())
    held = []
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert held == [(1 << 12) * 8]                  # the large request was not kept
    a = scratch.take("reuse", 5000)
    assert scratch.take("reuse", 3000).base is a.base   # the same memory, handed out again


def test_the_ulp_maximum_equals_the_metrics_count_on_every_kind_of_pattern():
    rng = np.random.default_rng(3)
    bits = rng.integers(-2 ** 31, 2 ** 31, size=50_000, dtype=np.int64).astype(np.int32)
    edge = np.array([0, -2 ** 31, 1, -1, -2 ** 31 + 1, 0x7F7FFFFF, -0x00800001,
                     0x00000001, -2 ** 31 + 0x7F7FFFFF], np.int32)   # +-0, subnormals, max
    a = np.concatenate([bits, edge, edge]).view(np.float32).copy()
    a[~np.isfinite(a)] = 1.0
    b = np.roll(a, 7).copy()
    b[-len(edge):] = a[-2 * len(edge):-len(edge)][::-1]             # edge against edge
    b[:5000] = -a[:5000]                                              # across zero
    starts = np.concatenate([[0], np.sort(rng.choice(np.arange(1, a.size), 40, False))])
    ends = np.append(starts[1:], a.size)
    want = [_ulps(a[s:e], b[s:e]) for s, e in zip(starts, ends)]
    assert batch._ulp_max(a, b, starts) == want
    assert max(want) > 2.0 ** 31                    # distances past int32 were exercised


@pytest.mark.parametrize("zero_position", [False, True])
def test_the_narrow_moved_count_equals_the_general_one(zero_position):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(3000) * 10.0 ** rng.integers(-40, 30, 3000)).astype(np.float32)
    x[::97] = 0.0
    x[5::101] = np.float32(2.0 ** -149)             # the smallest subnormal
    a = x.copy()
    a[::3] = np.nextafter(a[::3], np.float32(np.inf))
    a[1::7] = np.float32(2.0 ** -149)
    if zero_position:
        x[1000:1500] = a[1000:1500] = 0.0
    starts = np.arange(0, 3000, 500)
    widths = np.full(len(starts), 500)
    x64, a64 = x.astype(np.float64), a.astype(np.float64)
    general = segmented_sums(a64, x64, x64, starts, widths)
    narrow = segmented_sums(a64, x64, x64, starts, widths, narrow=True)
    assert np.array_equal(general, narrow)
    assert general[:, MOVED].sum() > 0 and general[:, TOWARD].sum() > 0
    if zero_position:
        assert not general[2].any()                 # a position of zeros weighs nothing

