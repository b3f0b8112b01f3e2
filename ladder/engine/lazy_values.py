"""An archive's values read from the file step by step (archive.read(lazy=True)): what lets
`ladder compare` stream two long recordings holding one step of each."""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

_NP = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64}


class LazyValues(Mapping):
    """An archive's values read from the file on access, one step at a time: the values of
    the step last asked for are kept, the rest stay on disk, so a comparison that walks the
    steps in order holds one step of each side (README "Bring your own port")."""

    def __init__(self, f, where, infos: dict, data_start: int, order: list, last=False,
                 error=ValueError):
        # error: the reader's exception class (archive.ArchiveError), passed in so this
        # module needs nothing of archive.py, which imports it
        self._f, self._where, self._infos, self._error = f, where, infos, error
        self._start, self._order, self._last = data_start, order, last
        self._index = set(order)
        self._spans = {}          # step -> (first byte, end byte, bytes) of its tensors
        for key in order:
            step = key.split("/", 1)[0]
            lo, hi = self._infos[key][2:]
            a, b, n = self._spans.get(step, (lo, hi, 0))
            self._spans[step] = (min(a, lo), max(b, hi), n + hi - lo)
        self._step, self._cache, self._arrays, self._buf, self._base = None, {}, None, None, 0
        self._by_step = {}        # step -> [(key, point, numpy dtype, shape, first, end byte)]
        for key in order:
            step, _, point = key.partition("/")
            dtype, shape, lo, hi = self._infos[key]
            np_dtype = np.dtype(_NP[dtype]) if dtype in _NP else None
            self._by_step.setdefault(step, []).append((key, point, np_dtype, shape, lo, hi))
        self.held = self.peak_held = 0       # bytes of values in memory now / at most

    def _hold(self, n: int):
        self.held += n
        self.peak_held = max(self.peak_held, self.held)

    def _load_step(self, step):
        """One read for the whole step when its tensors lie together (a writer that sorts
        keys puts them so), else per tensor on demand."""
        self._step, self._cache, self._arrays, self._buf, self.held = step, {}, None, None, 0
        if step not in self._spans:
            # a step with no tensor here (every point declared not emitted): nothing to read;
            # asking for one of its keys is a KeyError of the mapping, as for any absent key
            return
        lo, hi, own = self._spans[step]
        if 0 < hi - lo <= 2 * own:
            self._buf, self._base = self._read(lo, hi, step), lo
            self._hold(hi - lo)

    def _read(self, lo, hi, what):
        buf = np.empty(hi - lo, dtype=np.uint8)
        self._f.seek(self._start + lo)
        if hi > lo and self._f.readinto(buf) != hi - lo:
            raise self._error(f"{self._where}: {what!r} is truncated at file offset "
                               f"{self._start + lo} (the file shrank while being read)")
        return buf

    def _raw(self, key):
        """The bytes of `key` as a numpy uint8 view of the step's buffer (or its own read)."""
        step = key.split("/", 1)[0]
        if step != self._step:
            self._load_step(step)
        dtype, shape, lo, hi = self._infos[key]
        if self._buf is not None:
            raw = self._buf[lo - self._base:hi - self._base]
            if (lo - self._base) % dtype.itemsize:
                raw = raw.copy()                 # unaligned for this dtype inside the step
            return raw
        raw = self._read(lo, hi, key)
        self._hold(hi - lo)
        return raw

    def step_arrays(self, step) -> dict:
        """Every value of `step` as a numpy array viewing the step's bytes (no copy), keyed
        by point; None for a 16-bit float, which numpy cannot hold (read those with [key],
        widened to float32). The comparison's batch reads a step so, in one call, without a
        tensor per point."""
        if step != self._step:
            self._load_step(step)
        if self._arrays is None:
            out, buf, base = {}, self._buf, self._base
            for key, point, np_dtype, shape, lo, hi in self._by_step.get(step, ()):
                if np_dtype is None:
                    out[point] = None
                    continue
                if buf is not None and not (lo - base) % np_dtype.itemsize:
                    raw = buf[lo - base:hi - base]
                else:                           # unaligned in the step, or read on its own
                    raw = self._raw(key)
                a = raw.view(np_dtype).reshape(shape)
                out[point] = a[-1:] if self._last else a
            self._arrays = out
        return self._arrays

    def __getitem__(self, key):
        if key not in self._index:
            raise KeyError(key)
        t = self._cache.get(key) if self._step == key.split("/", 1)[0] else None
        if t is None:
            dtype, shape = self._infos[key][:2]
            raw = self._raw(key)
            # torch views no empty byte tensor as another dtype (its stride reads 0)
            t = torch.from_numpy(raw).view(dtype).reshape(shape) if raw.size else \
                torch.empty(shape, dtype=dtype)
            if dtype in (torch.float16, torch.bfloat16):
                t = t.float()
            if self._last:
                t = t[-1:]
            self._cache[key] = t
        return t

    def __iter__(self):
        return iter(self._order)

    def __len__(self):
        return len(self._order)

    def __contains__(self, key):
        return key in self._index

    def shape(self, key) -> tuple:
        """The shape of `key` as read, without reading it."""
        shape = list(self._infos[key][1])
        return tuple([1] + shape[1:] if self._last else shape)

    def last_only(self) -> "LazyValues":
        return LazyValues(self._f, self._where, self._infos, self._start, self._order, True,
                          self._error)

    def numel(self) -> int:
        n = 0
        for key in self._order:
            shape = self._infos[key][1]
            n += math.prod(([1] + list(shape[1:])) if self._last else shape)
        return n
