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
    ids = torch.tensor([[*s, *[pad_id] * (width - len(s))] for s in seqs], dtype=torch.long)
    lengths = torch.tensor([[len(s)] for s in seqs], dtype=torch.long)
    mask = (torch.arange(width).unsqueeze(0) < lengths).long()
    offsets = torch.tensor(start if start is not None else [0] * len(seqs), dtype=torch.long)
    steps = torch.minimum(torch.arange(width).unsqueeze(0), (lengths - 1).clamp(min=0))
    return ids, mask, offsets.unsqueeze(1) + steps


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


PASS_TOKENS = 128
"""What one more forward pass costs, in padded tokens (its fixed per-call work: module calls,
kernel launches, the autograd graph): the price :func:`length_batches` sets against the pads a
split saves, and scoring's :func:`shared_prefix_groups` against the head tokens a group saves
(measured on the tiny backbone: docs/performance.md)."""


def shared_prefix_groups(
    seqs: Sequence[Sequence[int]], max_group: int, pass_tokens: int = 0
) -> list[tuple[list[int], int]]:
    """Micro-batches of ``seqs`` (indices) that share a token prefix, with its length.

    Decisions of one task repeat the task's prompt head (system text, task, roles, menu), so
    a micro-batch of them can run the head once and only the rest per row. ``seqs`` are sorted
    lexicographically (a sorted run's common prefix is the smallest common prefix of neighbours)
    and cut into runs whose neighbours share at least T tokens, T chosen among the neighbour
    values to maximize the prefix tokens saved, Σ shared · (size − 1), less ``pass_tokens``
    for every forward pass the groups take (each group one, and one more for its head when it
    shares one: scoring runs them one by one; the sampler, which runs all heads in one pass,
    leaves it 0); runs longer than ``max_group`` are split. The shared length stays below each
    member's length (the last token is always run per row); a single-member group shares 0.
    Deterministic in ``seqs``.
    """
    if max_group < 1:
        raise ValueError(f"max_group must be >= 1, got {max_group}")
    if not seqs:
        return []
    order = sorted(range(len(seqs)), key=lambda i: list(seqs[i]))
    caps = [len(seqs[i]) - 1 for i in order]
    near = [
        min(_common_prefix(seqs[a], seqs[b]), caps[k], caps[k + 1])
        for k, (a, b) in enumerate(zip(order, order[1:], strict=False))
    ]

    def cut(threshold: int) -> list[tuple[list[int], int]]:
        groups: list[tuple[list[int], int]] = []
        members, shared = [order[0]], caps[0]
        for k, i in enumerate(order[1:]):
            if near[k] >= threshold and len(members) < max_group:
                members.append(i)
                shared = min(shared, near[k])
            else:
                groups.append((members, shared if len(members) > 1 else 0))
                members, shared = [i], caps[k + 1]
        groups.append((members, shared if len(members) > 1 else 0))
        return groups

    def saved(groups: list[tuple[list[int], int]]) -> int:
        passes = len(groups) + sum(shared > 0 for _, shared in groups)
        return sum(shared * (len(members) - 1) for members, shared in groups) - pass_tokens * passes

    return max((cut(t) for t in sorted({0, *near})), key=saved)


def length_batches(lengths: Sequence[int], pass_tokens: int = PASS_TOKENS) -> list[list[int]]:
    """Split rows into padded batches with the fewest padded tokens plus ``pass_tokens`` a
    batch: rows sorted by length (longest first, ties by index), cut into consecutive runs by
    an exact dynamic programme over the cut points (a padded batch costs its size times its
    longest row). Deterministic in ``lengths``; every row in exactly one batch."""
    if not lengths:
        return []
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    n = len(order)
    best = [0.0] + [float("inf")] * n  # best[k]: the cheapest cost of order[:k]
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        for start in range(end):
            # sorted longest first: the run order[start:end] pads to order[start]'s length
            cost = best[start] + (end - start) * lengths[order[start]] + pass_tokens
            if cost < best[end]:
                best[end], cut[end] = cost, start
    runs, end = [], n
    while end > 0:
        runs.append(order[cut[end] : end])
        end = cut[end]
    return runs[::-1]
