"""A divergence shrunk to its smallest reproducer: the fewest positions, the shortest prompt,
the smallest window, token ids moved to a canonical small value, that still show the same
divergence (the same first point, the same own / inherited verdict).

The search is an explicit delta-debugging one (Zeller's ddmin, applied per dimension of the
schedule), not Hypothesis: a candidate is one whole comparison (the reference and the port
over the schedule), seconds on the shipped preset, so the search is ordered to try the
candidates most likely to keep the divergence first and to stop at a fixpoint, and each
candidate is the same ordinary comparison `run` makes (judge). Hypothesis's shrinker would
draw its own examples and needs the property to be cheap; here every try is reported.

Each pass tries strictly smaller schedules of its dimension, keeps the first that keeps the
divergence and goes on from it until none does:
  1. fewer decode steps (from the end),
  2. a shorter prompt (its last tokens dropped; a prefill of 1 at the least),
  3. chunks of positions removed anywhere (ddmin: halves, quarters, ... of the tokens),
  4. a smaller window, alone or with the positions cut to fill it (so a divergence that needs
     the ring to wrap keeps a wrap on fewer positions, and one that does not loses it),
  5. fewer layers, where the model allows (a sub-model of its first k layers, which the
     reference and the port both build from the same parameters sliced),
  6. token ids set to CANONICAL (1): all at once, then halves, ..., then one by one;
and the round of passes repeats while any pass moved (or until --max-time: the best so far is
the answer). A schedule is compared once, however many passes reach it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

CANONICAL = 1                  # the token id a shrunk schedule moves toward


@dataclass(frozen=True)
class Schedule:
    tokens: tuple
    prompt_len: int
    window: int
    layers: int = 0            # the first `layers` layers of the model (0: the model as is)

    @property
    def steps(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def wraps(self) -> bool:
        """The ring wraps: more positions than the window holds."""
        return 0 < self.window < len(self.tokens)

    def size(self) -> tuple:
        """What the search minimises, in order: positions, a wrap of the ring (kept only where
        the divergence needs it), window, ids off the canonical one, prompt length."""
        return (len(self.tokens), self.wraps, self.window, self.layers,
                sum(t != CANONICAL for t in self.tokens), self.prompt_len)

    def describe(self) -> str:
        n, k = len(self.tokens), self.steps
        return (f"{n} position{'s' * (n != 1)} (prompt {self.prompt_len} + {k} "
                f"step{'s' * (k != 1)}), window {self.window}"
                f"{', the ring wraps' if self.wraps else ''}"
                + (f", {self.layers} layer{'s' * (self.layers != 1)}" if self.layers else ""))


@dataclass(frozen=True)
class Divergence:
    point: str               # the step-free point, e.g. L03.q (or "PATH:point" for a path)
    verdict: str             # own / inherited / undecided / path / "" (not split)
    step: str
    position: int
    fraction: float          # the first failing position's error, of its allowance

    def same(self, other) -> bool:
        return other is not None and (self.point, self.verdict) == (other.point,
                                                                      other.verdict)

    def describe(self) -> str:
        how = f" ({self.verdict})" if self.verdict else ""
        frac = "unbounded" if self.fraction == float("inf") else f"{self.fraction:.3g}"
        return (f"{self.point}{how} first at {self.step}/{self.point} position "
                f"{self.position}, {frac} of its allowance")


@dataclass
class Result:
    start: Schedule
    best: Schedule
    divergence: Divergence
    tried: int
    seconds: float
    timed_out: bool

    def ratio(self) -> float:
        return len(self.start.tokens) / len(self.best.tokens)


class Search:
    """check(schedule) -> Divergence or None, run under a time budget, with progress."""

    def __init__(self, check, keep: Divergence, windows: range, max_time=None,
                 progress=None, layers: range = range(0)):
        self.check, self.keep, self.windows, self.layers = check, keep, windows, layers
        self.deadline = None if max_time is None else time.monotonic() + max_time
        self.progress = progress or (lambda line: None)
        self.tried = 0
        self.found = None

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def keeps(self, cand: Schedule, best: Schedule) -> bool:
        if self.out_of_time() or cand.size() >= best.size():
            return False
        if cand not in self.seen:                # one comparison per schedule, ever
            self.tried += 1
            self.seen[cand] = got = self.check(cand)
            ok = self.keep.same(got)
            what = "keeps it" if ok else "loses it" if got is None else "shows " + got.point
            now = cand if ok else best
            self.progress(f"shrink: candidate {self.tried}: {cand.describe()}: {what}; best "
                          f"so far {len(now.tokens)} positions, window {now.window}")
        got = self.seen[cand]
        if self.keep.same(got):
            self.found = got
            return True
        return False

    def passes(self):
        """The dimensions, in order: each a function schedule -> smaller candidates."""
        def fewer_steps(s):
            for steps in range(0, s.steps):
                yield replace(s, tokens=s.tokens[:s.prompt_len + steps])

        def shorter_prompt(s):
            p = s.prompt_len
            for q in range(1, p):
                yield replace(s, tokens=s.tokens[:q] + s.tokens[p:], prompt_len=q)

        def chunks(s):                            # ddmin: halves, quarters, ... removed
            n, p = len(s.tokens), s.prompt_len
            chunk = n // 2
            while chunk >= 1:
                for lo in range(0, n, chunk):
                    hi = min(n, lo + chunk)
                    q = p - max(0, min(hi, p) - lo)
                    if n - (hi - lo) >= 1 and q >= 1:
                        yield replace(s, tokens=s.tokens[:lo] + s.tokens[hi:], prompt_len=q)
                chunk //= 2

        def smaller_window(s):
            for w in self.windows:
                if w < s.window:
                    yield replace(s, window=w)
                    if len(s.tokens) > w:           # a full window of w, without the wrap
                        yield replace(s, window=w, tokens=s.tokens[:w],
                                      prompt_len=min(s.prompt_len, w))

        def fewer_layers(s):                      # a sub-model: the first k layers
            for k in self.layers:
                if k < s.layers:
                    yield replace(s, layers=k)

        def canonical(s):                         # all at once, then halves, then one by one
            n = len(s.tokens)
            chunk = n
            while chunk >= 1:
                for lo in range(0, n, chunk):
                    toks = s.tokens[:lo] + (CANONICAL,) * len(s.tokens[lo:lo + chunk]) + \
                        s.tokens[lo + chunk:]
                    if toks != s.tokens:
                        yield replace(s, tokens=toks)
                chunk //= 2
        return (fewer_steps, shorter_prompt, chunks, smaller_window, fewer_layers, canonical)

    def run(self, start: Schedule) -> Result:
        """Each pass shrinks its dimension as far as it goes; the round of passes repeats while
        any pass moved (a smaller window may let fewer positions keep the divergence)."""
        t0 = time.monotonic()
        self.seen = {}
        best, moved = start, True
        while moved and not self.out_of_time():
            moved = False
            for make in self.passes():
                stepped = True
                while stepped and not self.out_of_time():
                    stepped = False
                    for cand in make(best):
                        if self.keeps(cand, best):
                            best, stepped, moved = cand, True, True
                            break
        return Result(start, best, self.found or self.keep, self.tried,
                      time.monotonic() - t0, self.out_of_time())
