"""Batched grammar-masked sampling of actions under π_θ (docs/method.md §1.6).

All pending decisions of many episodes advance together: one pass for the prompt heads that
groups of decisions share, then one forward pass per decoding depth over the batch, reusing
the KV cache. Positions with a single allowed token are appended without
a model call; at a branching position the next token is drawn, with the decision's own
generator, from the softmax restricted to the allowed tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import Cache

from evosteer_core.policy.backbone import Policy
from evosteer_core.policy.batch import right_pad, shared_prefix_groups
from evosteer_core.policy.trie import TrieNode, action_trie


@dataclass(frozen=True)
class SampledAction:
    """One decision: the chosen action, its tokens, the grammar mask along it, and ℓ_θ."""

    text: str
    index: int
    """Position in the decision's legal list."""
    token_ids: tuple[int, ...]
    allowed: tuple[tuple[int, ...], ...]
    """Allowed token ids at each position (a 1-tuple where the position was forced)."""
    logp: float
    """ℓ_θ(a|s) = Σ_j log softmax over the allowed set (temperature 1); forced positions add 0."""
    hidden: torch.Tensor | None = None
    """With ``return_hidden``: the last-layer hidden state at the prompt's final token (float32
    [d_h], from the pass that sampled; None for a single legal action, which runs no pass)."""


def _follow_forced(node: TrieNode, out: list[int]) -> TrieNode:
    """Append single-child tokens to ``out`` until a branching node or a leaf."""
    while node.action < 0 and len(node.children) == 1:
        token, node = next(iter(node.children.items()))
        out.append(token)
    return node


def _check_batch(
    prompts: Sequence[str], legal: Sequence[Sequence[str]], n_other: int, what: str
) -> None:
    if not len(prompts) == len(legal) == n_other:
        raise ValueError(
            f"batch sizes differ: {len(prompts)} prompts, {len(legal)} legal sets, {n_other} {what}"
        )


def _shared_heads(
    policy: Policy, pending: list[list[int]], prompt_lengths: list[int]
) -> tuple[list[int], Cache | None, torch.Tensor | None]:
    """Run each group's shared prompt head once (docs/performance.md) and drop it from
    ``pending`` (in place). Returns, per row, the tokens already in the cache, and the cache
    and its mask with one row per decision: the head's keys and values, padded to the longest
    head (pads masked out; a row in no group has an all-masked head).

    Decisions of one task repeat its head (system text, family, roles, menu); the groups are
    ``shared_prefix_groups`` of the prompts, as in scoring, so the head stays shorter than
    every member's prompt and the rest of each prompt still runs per row.
    """
    seen = [0] * len(pending)
    groups = [
        (members, shared)
        for members, shared in shared_prefix_groups(
            [p[:n] for p, n in zip(pending, prompt_lengths, strict=True)], max(1, len(pending))
        )
        if shared > 0
    ]
    if not groups:
        return seen, None, None
    ids, head_mask, pos = right_pad(
        [pending[members[0]][:shared] for members, shared in groups], policy.tokenizer.pad_id
    )
    no_read = torch.zeros(len(groups), 0, dtype=torch.long)
    _, cache = policy.hidden(ids, head_mask, pos, use_cache=True, read=no_read)
    which = [0] * len(pending)
    in_group = torch.zeros(len(pending), 1, dtype=head_mask.dtype)
    for g, (members, shared) in enumerate(groups):
        for m in members:
            which[m], seen[m] = g, shared
            pending[m] = pending[m][shared:]
            in_group[m] = 1
    index = torch.tensor(which)
    cache.batch_select_indices(index.to(policy.device))
    return seen, cache, head_mask[index] * in_group


def sample_actions(
    policy: Policy,
    prompts: Sequence[str],
    legal: Sequence[Sequence[str]],
    generators: Sequence[torch.Generator],
    temperature: float = 1.0,
    return_hidden: bool = False,
) -> list[SampledAction]:
    """Sample one legal action per decision; a single legal action is returned unsampled.

    ``generators[i]`` drives decision i only, so a decision's draws do not depend on which
    other decisions share the batch. ``logp`` is ℓ_θ at temperature 1 whatever ``temperature``.
    With ``return_hidden`` each sampled decision also carries the prompt's last hidden state
    from its prefill (causal attention: the action tokens after it cannot change it).
    """
    _check_batch(prompts, legal, len(generators), "generators")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    tok = policy.tokenizer
    tries = [action_trie(actions, tok) for actions in legal]
    results: list[SampledAction | None] = [None] * len(prompts)
    rows = [i for i, trie in enumerate(tries) if len(trie.legal) > 1]
    for i, trie in enumerate(tries):
        if len(trie.legal) == 1:
            results[i] = SampledAction(
                trie.legal[0], 0, trie.sequences[0], trie.path_allowed(0), 0.0
            )
    if not rows:
        return results  # type: ignore[return-value]

    nodes: list[TrieNode] = []
    tokens: list[list[int]] = []
    pending: list[list[int]] = []
    prompt_lengths: list[int] = []
    for i in rows:
        prefix: list[int] = []
        nodes.append(_follow_forced(tries[i].root, prefix))
        tokens.append(list(prefix))
        prompt_ids = tok.encode_prompt(prompts[i])
        prompt_lengths.append(len(prompt_ids))
        pending.append(prompt_ids + prefix)
    hiddens: list[torch.Tensor | None] = [None] * len(rows)
    logps = [0.0] * len(rows)
    live = list(range(len(rows)))  # rows (indices into ``rows``) still decoding, cache order
    with torch.no_grad():
        seen, cache, cache_mask = _shared_heads(policy, pending, prompt_lengths)
        prefill = True
        while live:
            ids, mask, pos = right_pad(
                [pending[r] for r in live], tok.pad_id, [seen[r] for r in live]
            )
            full_mask = mask if cache_mask is None else torch.cat([cache_mask, mask], dim=1)
            last_at = (mask.sum(dim=1) - 1).unsqueeze(1)
            if return_hidden and prefill:  # the rest of every row's prompt is in this pass
                here = torch.tensor([[prompt_lengths[r] - 1 - seen[r]] for r in live])
                read = torch.cat([last_at, here], dim=1)
            else:
                read = last_at
            hidden, cache = policy.hidden(ids, full_mask, pos, cache, use_cache=True, read=read)
            if return_hidden and prefill:
                for slot, r in enumerate(live):
                    hiddens[r] = hidden[slot, 1].float().cpu().clone()
            prefill = False
            last = hidden[:, 0]
            logits = policy.logits(last).cpu()
            keep = []
            for slot, r in enumerate(live):
                seen[r] += len(pending[r])
                node = nodes[r]
                allowed = torch.tensor(node.allowed, dtype=torch.long)
                sub = logits[slot, allowed]
                choice = int(
                    torch.multinomial(
                        torch.softmax(sub / temperature, dim=0), 1, generator=generators[rows[r]]
                    )
                )
                logps[r] += float(torch.log_softmax(sub, dim=0)[choice])
                token = node.allowed[choice]
                fed = [token]
                nodes[r] = _follow_forced(node.children[token], fed)
                tokens[r].extend(fed)
                pending[r] = fed
                if nodes[r].action < 0:
                    keep.append(slot)
            live = [live[s] for s in keep]
            if live and len(keep) < len(mask):
                cache.batch_select_indices(torch.tensor(keep, device=hidden.device))
            cache_mask = full_mask[keep]
    for r, i in enumerate(rows):
        index = nodes[r].action
        trie = tries[i]
        results[i] = SampledAction(
            trie.legal[index],
            index,
            trie.sequences[index],
            trie.path_allowed(index),
            logps[r],
            hiddens[r],
        )
    return results  # type: ignore[return-value]
