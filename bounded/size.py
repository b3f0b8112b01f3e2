"""Sizes of memory: the default budget, '2G'-style sizes parsed, byte counts printed. A leaf
(bounded/): the reference's memory-budget check (reference/memory_budget.py) and the ladder's
readers share one default and one parser.
"""
from __future__ import annotations

import re

GIB = 1 << 30
DEFAULT_MAX_MEMORY = 2 * GIB
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": GIB, "GB": GIB, "GIB": GIB, "T": 1 << 40,
          "TB": 1 << 40, "TIB": 1 << 40}


def fmt_bytes(n: int) -> str:
    """A byte count as people read it: GiB from a tenth of one, then MiB, then bytes."""
    if n >= GIB / 10:
        return f"{n / GIB:.2f} GiB"
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n} bytes"


def parse_size(text: str) -> int:
    """'2G', '512M', '1.5GiB', '1000000' -> bytes (binary units). ValueError otherwise."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS or len(m.group(1)) > 20:
        raise ValueError(f"memory size {text!r} must be a number with an optional unit "
                         f"K, M, G or T (binary), e.g. 2G")
    n = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if n < 1:
        raise ValueError(f"memory size {text!r} must be at least 1 byte")
    return n


def cli_size(text: str) -> int:
    """argparse `type=` for --max-memory: parse_size with argparse's error (exit 2, one line)."""
    import argparse
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
