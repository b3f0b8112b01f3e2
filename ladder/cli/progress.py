"""A tiny progress bar (no dependency): drawn on a terminal, silent otherwise; and `Stages`,
one line per stage of a long tool, terminal or log alike.

The bar redraws at most ~10 times a second so it costs nothing next to a model step; on a
non-TTY stream (CI logs, pipes, tests) it writes nothing at all, keeping captured output clean.
"""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, stream=None, enabled=None, width: int = 28):
        self.total, self.label, self.width = max(int(total), 1), label, width
        self.stream = sys.stderr if stream is None else stream
        self.enabled = (hasattr(self.stream, "isatty") and self.stream.isatty()) \
            if enabled is None else enabled
        self.done, self.t0, self.last = 0, time.perf_counter(), 0.0

    def __enter__(self):
        self._draw(force=True)
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()
        return False

    def update(self, n: int = 1):
        self.done = min(self.total, self.done + n)
        self._draw()

    def _draw(self, force=False):
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self.last < 0.1 and self.done < self.total:
            return
        self.last = now
        fill = self.width * self.done // self.total
        bar = "#" * fill + "." * (self.width - fill)
        self.stream.write(f"\r{self.label:<22s} [{bar}] {self.done}/{self.total} "
                          f"{now - self.t0:5.1f}s")
        self.stream.flush()


def bar(total: int, label: str, enabled=None) -> Progress:
    return Progress(total, label, enabled=enabled)


class Stages:
    """One stderr line as each stage of a long tool starts (on a terminal or into a log), with
    the time since the tool started: a benchmark that takes minutes is never silent, and its
    log says where the time went. `stages("building torch:cq")`."""

    def __init__(self, tool: str, stream=None):
        self.tool, self.stream, self.t0 = tool, stream, time.perf_counter()

    def __call__(self, what: str) -> None:
        stream = sys.stderr if self.stream is None else self.stream
        stream.write(f"{self.tool} [{time.perf_counter() - self.t0:7.1f} s] {what}\n")
        stream.flush()
