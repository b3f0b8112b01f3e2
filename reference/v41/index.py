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
        # a chunk's rows are its own positions: query t reads the min(m, window) positions
        # starting at max(0, t - window + 1), those past t (not yet seen) as -1
        width = min(m, window)
        rows = []
        for t in range(m):
            first = max(0, t - window + 1)
            rows.append([p if p <= t else -1 for p in range(first, first + width)])
        return torch.tensor(rows, dtype=torch.int32)
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
    owner = torch.arange(width) // block                  # the block each position belongs to
    n_blocks = -(-width // block)
    # a block's rank is its best position's score: fold in the j-th member of every block at
    # once (positions j, j + block, ...; a short last block lacks its late members)
    rank = torch.full((m, n_blocks), -torch.inf, dtype=scores.dtype)
    for j in range(min(block, width)):
        member = scores[:, j::block]
        rank[:, :member.shape[1]] = torch.maximum(rank[:, :member.shape[1]], member)
    newest = (lens - 1).div(block, rounding_mode="floor")     # nothing visible: -1, no block
    rank = rank.masked_fill(torch.arange(n_blocks)[None, :] == newest, torch.inf)
    # the blocks torch's CPU topk keeps (its tie rule is the official one, spec §3.7), less any
    # whose best is -inf (fewer reachable blocks than topk_blocks)
    picked = torch.zeros(m, n_blocks, dtype=torch.bool)
    picked[torch.arange(m)[:, None], rank.topk(min(topk_blocks, n_blocks), dim=-1).indices] = True
    return (picked & (rank > -torch.inf))[:, owner]


def select(scores: torch.Tensor, lens: torch.Tensor, k: int, offset: int) -> torch.Tensor:
    """scores [m, W] -> [m, k] int32 row indices past `offset`, ascending, -1 if not visible."""
    # which k: the set torch's CPU topk returns (its tie rule is the official one, spec §3.7);
    # the order is then by position, not by score
    chosen, _ = torch.sort(torch.topk(scores, k, dim=-1, sorted=False).indices, dim=-1)
    return (chosen + offset).masked_fill(chosen >= lens, -1).to(torch.int32)
