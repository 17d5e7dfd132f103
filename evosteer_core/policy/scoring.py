"""Teacher-forced scoring ℓ(a|s) of actions under θ (adapter on) or ρ (adapter off) (docs/method.md §1.6).

ℓ(a|s) = Σ_j log softmax over the allowed set at position j of a's token sequence; a forced
position (one allowed token) contributes exactly 0, so only branching positions are computed.
Each group holds decisions that share a prompt prefix (the task's head; groups priced per pass,
``shared_prefix_groups``): the prefix runs once, the rest of each prompt + its action tokens
in length-sorted padded batches (``length_batches``) on top of its KV cache (explicit
positions); θ and ρ see the same prompt, tokens, mask and batches.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from evosteer_core.policy.backbone import Policy
from evosteer_core.policy.batch import (
    PASS_TOKENS,
    length_batches,
    right_pad,
    shared_prefix_groups,
)
from evosteer_core.policy.encode import rms_normalize
from evosteer_core.policy.trie import action_trie

DEFAULT_BATCH = 64
"""Decisions per forward pass."""


def score_actions(
    policy: Policy,
    prompts: Sequence[str],
    action_texts: Sequence[str],
    legal: Sequence[Sequence[str]],
    use_adapter: bool,
    requires_grad: bool,
    batch_size: int = DEFAULT_BATCH,
) -> torch.Tensor:
    """ℓ(action_texts[i] | prompts[i]) under the grammar mask of ``legal[i]``: float32 [B].

    ``use_adapter`` selects θ (True) or ρ (False); with ``requires_grad`` the result carries a
    graph into the LoRA parameters, otherwise it is computed without autograd. With
    ``requires_grad`` the activations of every micro-batch live until backward: for large
    batches call this per micro-batch and backward each (gradient accumulation).
    """
    scores, _ = _score(
        policy, prompts, action_texts, legal, use_adapter, requires_grad, batch_size, False
    )
    return scores


def score_and_encode_rho(
    policy: Policy,
    prompts: Sequence[str],
    action_texts: Sequence[str],
    legal: Sequence[Sequence[str]],
    batch_size: int = DEFAULT_BATCH,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ℓ_ρ of each action and h_ρ of each prompt from one ρ forward pass per micro-batch.

    Causal attention makes the hidden state at the last prompt token independent of the
    action tokens after it, so h_ρ equals ``encode_h_rho``'s; saves one pass over the prompts.
    Returns (float32 [B], float32 [B, d_h] on CPU).
    """
    scores, hidden = _score(policy, prompts, action_texts, legal, False, False, batch_size, True)
    return scores, rms_normalize(hidden).cpu()


def _score(
    policy: Policy,
    prompts: Sequence[str],
    action_texts: Sequence[str],
    legal: Sequence[Sequence[str]],
    use_adapter: bool,
    requires_grad: bool,
    batch_size: int,
    encode: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores, and with ``encode`` the last-prompt-token hidden states (every row is run)."""
    if not len(prompts) == len(action_texts) == len(legal):
        raise ValueError(
            f"batch sizes differ: {len(prompts)} prompts, {len(action_texts)} actions, "
            f"{len(legal)} legal sets"
        )
    tok = policy.tokenizer
    items = []  # (row, prompt ids, action ids, allowed per position)
    for row, (prompt, text, actions) in enumerate(zip(prompts, action_texts, legal, strict=True)):
        trie = action_trie(actions, tok)
        index = trie.index_of(text)
        allowed = trie.path_allowed(index)
        if encode or any(len(a) > 1 for a in allowed):
            items.append((row, tok.encode_prompt(prompt), trie.sequences[index], allowed))
    scores = torch.zeros(len(prompts), dtype=torch.float32, device=policy.device)
    encoded: list[torch.Tensor | None] = [None] * len(prompts)
    groups = shared_prefix_groups(
        [prompt_ids for _, prompt_ids, _, _ in items], batch_size, PASS_TOKENS
    )
    grad = torch.enable_grad() if requires_grad else torch.no_grad()
    with grad, policy.adapter_context(use_adapter):
        for members, shared in groups:
            head = head_cache(policy, items[members[0]][1][:shared])
            lengths = [len(items[m][1]) + len(items[m][2]) - 1 - shared for m in members]
            for batch in length_batches(lengths):
                chunk = [items[members[k]] for k in batch]
                scores = _score_chunk(policy, chunk, shared, head, encode, scores, encoded)
    return scores, torch.stack(encoded) if encode else None


def _score_chunk(
    policy: Policy,
    chunk: list[tuple[int, list[int], tuple[int, ...], tuple[tuple[int, ...], ...]]],
    shared: int,
    head: list[tuple[torch.Tensor, torch.Tensor]] | None,
    encode: bool,
    scores: torch.Tensor,
    encoded: list[torch.Tensor | None],
) -> torch.Tensor:
    """One padded pass of decisions after their shared head: ``scores`` with theirs added,
    and with ``encode`` their h_ρ rows written into ``encoded``."""
    slots, places, targets, rows, masks = [], [], [], [], []
    for slot, (row, prompt_ids, action_ids, allowed) in enumerate(chunk):
        for j, options in enumerate(allowed):
            if len(options) > 1:
                slots.append(slot)
                places.append(len(prompt_ids) - 1 - shared + j)
                targets.append(options.index(action_ids[j]))
                rows.append(row)
                masks.append(options)
    if not slots and not encode:
        return scores
    wanted = [[len(p) - 1 - shared] if encode else [] for _, p, _, _ in chunk]
    for slot, place in zip(slots, places, strict=True):
        wanted[slot].append(place)
    read, column = read_positions(wanted)
    hidden = hidden_after_prefix(
        policy, [p + list(a[:-1]) for _, p, a, _ in chunk], shared, read, head
    )
    if encode:
        for slot, (row, _, _, _) in enumerate(chunk):
            encoded[row] = hidden[slot, 0].float()
    if not slots:
        return scores
    at = torch.tensor([column[slot][place] for slot, place in zip(slots, places, strict=True)])
    logits = policy.logits(hidden[torch.tensor(slots), at])
    width = max(len(m) for m in masks)
    option_ids = torch.tensor([list(m) + [m[0]] * (width - len(m)) for m in masks])
    valid = torch.tensor([[k < len(m) for k in range(width)] for m in masks])
    sub = logits.gather(1, option_ids.to(logits.device))
    sub = sub.masked_fill(~valid.to(logits.device), float("-inf"))
    picked = torch.log_softmax(sub, dim=1)[torch.arange(len(targets)), torch.tensor(targets)]
    return scores.index_add(0, torch.tensor(rows, device=scores.device), picked)


def read_positions(wanted: list[list[int]]) -> tuple[torch.Tensor, list[dict[int, int]]]:
    """The [B, K] ``read`` tensor of ``Policy.hidden`` for each row's wanted positions (in
    order, repeats dropped; short rows repeat their first position), and per row the column
    of each wanted position in it."""
    columns = [dict.fromkeys(w) for w in wanted]
    for k, col in enumerate(columns):
        for j, place in enumerate(col):
            col[place] = j
        if not col:
            raise ValueError(f"row {k} reads no position")
    width = max(len(c) for c in columns)
    read = [list(c) + [next(iter(c))] * (width - len(c)) for c in columns]
    return torch.tensor(read, dtype=torch.long), columns


def head_cache(policy: Policy, head: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Keys and values, per layer, of a shared prompt head run once (batch 1; its last layer
    only fills the cache); None for an empty head. With a graph, every pass built on it
    sends its gradient back into this one pass."""
    if not head:
        return None
    ids = torch.tensor([head], dtype=torch.long)
    _, cache = policy.hidden(
        ids,
        torch.ones_like(ids),
        torch.arange(len(head)).unsqueeze(0),
        use_cache=True,
        read=torch.zeros(1, 0, dtype=torch.long),
    )
    return [(layer.keys, layer.values) for layer in cache.layers]


def hidden_after_prefix(
    policy: Policy,
    seqs: list[list[int]],
    shared: int,
    read: torch.Tensor | None = None,
    head: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> torch.Tensor:
    """Hidden states of ``seqs[i][shared:]`` (right-padded) after their common first
    ``shared`` tokens, which run once and reach every row through a repeated KV cache
    (gradients from all rows flow back into that one pass); ``shared = 0`` is a plain padded
    forward pass. With ``read`` ([B, K] positions of ``seqs[i][shared:]``) only those
    (``Policy.hidden``); ``head``, the head's :func:`head_cache`, lets several batches share
    one head pass (else the head runs here, at every position)."""
    pad = policy.tokenizer.pad_id
    if shared == 0:
        ids, mask, pos = right_pad(seqs, pad)
        return policy.hidden(ids, mask, pos, read=read)[0]
    if head is None:  # the head's pass at every position (CollabFlow's scoring)
        prefix = torch.tensor([seqs[0][:shared]], dtype=torch.long)
        _, cache = policy.hidden(
            prefix, torch.ones_like(prefix), torch.arange(shared).unsqueeze(0), use_cache=True
        )
        cache.batch_repeat_interleave(len(seqs))
    else:
        cache = DynamicCache(config=policy.model.config)
        for layer, (keys, values) in enumerate(head):
            cache.update(
                keys.expand(len(seqs), -1, -1, -1), values.expand(len(seqs), -1, -1, -1), layer
            )
    ids, mask, pos = right_pad([s[shared:] for s in seqs], pad, [shared] * len(seqs))
    full_mask = torch.cat([torch.ones(len(seqs), shared, dtype=mask.dtype), mask], dim=1)
    return policy.hidden(ids, full_mask, pos, cache, use_cache=True, read=read)[0]
