"""Batched grammar-masked sampling of actions under π_θ (docs/method.md §1.6).

All pending decisions of many episodes advance together: one forward pass per decoding depth
over the batch, reusing a KV cache. Positions with a single allowed token are appended without
a model call; at a branching position the next token is drawn, with the decision's own
generator, from the softmax restricted to the allowed tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from evosteer_core.policy.backbone import Policy
from evosteer_core.policy.batch import right_pad
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


def sample_actions(
    policy: Policy,
    prompts: Sequence[str],
    legal: Sequence[Sequence[str]],
    generators: Sequence[torch.Generator],
    temperature: float = 1.0,
) -> list[SampledAction]:
    """Sample one legal action per decision; a single legal action is returned unsampled.

    ``generators[i]`` drives decision i only, so a decision's draws do not depend on which
    other decisions share the batch. ``logp`` is ℓ_θ at temperature 1 whatever ``temperature``.
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
    for i in rows:
        prefix: list[int] = []
        nodes.append(_follow_forced(tries[i].root, prefix))
        tokens.append(list(prefix))
        pending.append(tok.encode_prompt(prompts[i]) + prefix)
    logps = [0.0] * len(rows)
    seen = [0] * len(rows)  # tokens of each row already in the KV cache
    live = list(range(len(rows)))  # rows (indices into ``rows``) still decoding, cache order
    cache, cache_mask = None, None
    with torch.no_grad():
        while live:
            ids, mask, pos = right_pad(
                [pending[r] for r in live], tok.pad_id, [seen[r] for r in live]
            )
            full_mask = mask if cache_mask is None else torch.cat([cache_mask, mask], dim=1)
            hidden, cache = policy.hidden(ids, full_mask, pos, cache, use_cache=True)
            lengths = mask.sum(dim=1)
            last = hidden[torch.arange(len(live)), (lengths - 1).to(hidden.device)]
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
            trie.legal[index], index, trie.sequences[index], trie.path_allowed(index), logps[r]
        )
    return results  # type: ignore[return-value]
