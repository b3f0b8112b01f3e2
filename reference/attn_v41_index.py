"""Index builders of V4.1 attention (attn_v41 spec §3.7, §4): integer, bit-exact.

window_idxs      which window rows each query reads: in a prefill (start_pos 0) the chunk's own
                 rows t-window+1..t (clipped at 0, -1 past the query); in a decode step the ring
                 slots oldest first, -1 for slots the sequence has not reached (so the -1 entries
                 come first while the ring fills: [-1,-1,-1,-1,0,1,2,3] at position 3, window 8)
candidate_keep   the candidate source's block filter: per query the top `topk_blocks` blocks of
                 `block` positions by their best score, the block of the newest visible position
                 always kept, blocks whose best score is -inf dropped
select           top-k positions by score (torch CPU topk: its tie rule is the official one),
                 sorted ascending, offset past the window rows, -1 where not visible
"""
from __future__ import annotations

import torch


def window_idxs(window: int, m: int, start_pos: int) -> torch.Tensor:
    if start_pos == 0:
        t = torch.arange(m)[:, None]
        j = (t - window + 1).clamp_min(0) + torch.arange(min(m, window))[None, :]
        return torch.where(j > t, -1, j).to(torch.int32)
    ring = [(start_pos + 1 + i) % window for i in range(window)]     # oldest slot first
    return torch.tensor([[s if s <= start_pos else -1 for s in ring]], dtype=torch.int32)


def visible_lens(m: int, start_pos: int, ratio: int) -> torch.Tensor:
    """Compressed positions each query sees: (t+1) div ratio in a prefill, all in a decode."""
    if start_pos == 0:
        return (torch.arange(1, m + 1) // ratio)[:, None]
    return torch.full((m, 1), (start_pos + m) // ratio)


def candidate_keep(scores: torch.Tensor, lens: torch.Tensor, topk_blocks: int,
                   block: int) -> torch.Tensor:
    """scores [m, W] (-inf where not visible), lens [m, 1] -> keep mask [m, W]."""
    m, width = scores.shape
    nb = -(-width // block)
    padded = torch.full((m, nb * block), -torch.inf, dtype=scores.dtype)
    padded[:, :width] = scores
    best = padded.view(m, nb, block).amax(-1)
    newest = (lens - 1) // block                    # -1 (nothing visible) pins no block
    best = torch.where(torch.arange(nb)[None, :] == newest, torch.inf, best)
    top = best.topk(min(topk_blocks, nb), dim=-1)
    keep = torch.zeros(m, nb, dtype=torch.bool)
    keep.scatter_(1, top.indices, top.values > -torch.inf)
    return keep.repeat_interleave(block, dim=1)[:, :width]


def select(scores: torch.Tensor, lens: torch.Tensor, k: int, offset: int) -> torch.Tensor:
    """scores [m, W] -> [m, k] int32 row indices past `offset`, ascending, -1 if not visible."""
    picked = scores.topk(k, dim=-1, sorted=False).indices.sort(dim=-1).values
    return torch.where(picked < lens, picked + offset, -1).to(torch.int32)
