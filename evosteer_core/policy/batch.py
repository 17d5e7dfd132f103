"""Right-padded token batches with explicit position ids (no fully masked attention rows)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def right_pad(
    seqs: Sequence[Sequence[int]], pad_id: int, start: Sequence[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, position_ids)`` for sequences padded on the right.

    Positions of row i count from ``start[i]`` (its tokens already in a KV cache, default 0);
    pads repeat the row's last position, and are masked out.
    """
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, seq in enumerate(seqs):
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[i, : len(seq)] = 1
    offsets = torch.tensor(start if start is not None else [0] * len(seqs), dtype=torch.long)
    lengths = mask.sum(dim=1, keepdim=True)
    steps = torch.minimum(torch.arange(width).unsqueeze(0), (lengths - 1).clamp(min=0))
    return ids, mask, offsets.unsqueeze(1) + steps
