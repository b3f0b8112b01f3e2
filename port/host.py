"""The host's part of a position: the Engram n-gram table rows and the presence bits, built
here once for every backend (the eager rows, the decode prep's static buffers, the C step's
host arrays)."""
from __future__ import annotations

SEED, PRIME, M32 = 0x9E3779B9, 0x01000193, 0xFFFFFFFF


def ngram_rows(cfg, tokens: list, pos: int) -> list:
    """Row of every Engram table for position `pos` (uint32 hash, spec §b.8), in Python ints."""
    rows = []
    for oi, order in enumerate(cfg.engram_orders):
        for h in range(cfg.engram_heads_eff):
            acc = (SEED * (oi * cfg.engram_heads_eff + h + 1)) & M32
            for j in range(order):
                tok = tokens[pos - j] if pos - j >= 0 else 0
                acc = ((acc ^ tok) * PRIME) & M32
            rows.append((acc ^ (acc >> 15)) % cfg.engram_slots)
    return rows


def table_orders(cfg) -> list:
    """The n-gram order of each Engram table (orders repeated per head), table order."""
    return [o for o in cfg.engram_orders for _ in range(cfg.engram_heads_eff)]


def host_row(cfg, tokens: list, valid: list, p: int) -> tuple:
    """The host's part of position p: (flat table rows [T], their presence [T] as 1.0/0.0,
    tap presence [taps] as bools) from the token ids and validity bits so far (None: every
    position valid). A table row counts when its n-gram's oldest token exists and is valid;
    a tap when its row does."""
    S, dil = cfg.engram_slots, cfg.engram_dilation
    flat = [t * S + row for t, row in enumerate(ngram_rows(cfg, tokens, p))]
    if valid is None:
        ok = [1.0 if p - (o - 1) >= 0 else 0.0 for o in table_orders(cfg)]
        taps = [p - j * dil >= 0 for j in range(cfg.engram_taps)]
    else:
        ok = [1.0 if p - (o - 1) >= 0 and valid[p - (o - 1)] else 0.0
              for o in table_orders(cfg)]
        taps = [bool(p - j * dil >= 0 and valid[p - j * dil]) for j in range(cfg.engram_taps)]
    return flat, ok, taps
