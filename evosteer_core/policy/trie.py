"""The grammar mask: the legal actions' token sequences as a prefix-free trie (docs/method.md §1.6).

Every sequence ends with EOS, and EOS occurs nowhere else, so no sequence is a prefix of
another; a leaf (reached by EOS) names the action it spells.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from evosteer_core.infra.memo import BoundedMemo
from evosteer_core.policy.tokenizer import MEMO_SIZE, PolicyTokenizer


class TrieNode:
    """One decoding position: the allowed next tokens, or the finished action at a leaf.

    A trie is not changed after it is built (tries are shared through :func:`action_trie`), so
    the sorted allowed set is computed once, when it is first asked for.
    """

    __slots__ = ("children", "action", "_allowed")

    def __init__(self) -> None:
        self.children: dict[int, TrieNode] = {}
        self.action = -1
        """Index into the legal list at a leaf (after EOS), else -1."""
        self._allowed: tuple[int, ...] | None = None

    @property
    def allowed(self) -> tuple[int, ...]:
        """Allowed next token ids, sorted."""
        if self._allowed is None:
            self._allowed = tuple(sorted(self.children))
        return self._allowed


class ActionTrie:
    """Token trie over a state's legal action texts."""

    def __init__(self, legal: Sequence[str], tokenizer: PolicyTokenizer) -> None:
        if not legal:
            raise ValueError("empty legal action set: nothing to sample or score")
        if len(set(legal)) != len(legal):
            raise ValueError(f"legal action set has duplicates: {sorted(legal)[:5]}...")
        self.legal = list(legal)
        self.sequences = [tokenizer.encode_action(text) for text in legal]
        self.root = TrieNode()
        for index, ids in enumerate(self.sequences):
            node = self.root
            for token in ids:
                if node.action >= 0:
                    raise ValueError(f"action {self.legal[node.action]!r} is a prefix of another")
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = TrieNode()
                node = child
            if node.children or node.action >= 0:
                raise ValueError(f"action {legal[index]!r} is not prefix-free in the trie")
            node.action = index
        self._paths: dict[int, tuple[tuple[int, ...], ...]] = {}

    def index_of(self, text: str) -> int:
        """Position of ``text`` in the legal list; a clear error if it is not legal."""
        try:
            return self.legal.index(text)
        except ValueError:
            raise ValueError(
                f"action {text!r} is not in the legal set ({len(self.legal)} actions)"
            ) from None

    def path_allowed(self, index: int) -> tuple[tuple[int, ...], ...]:
        """The allowed-token set at each position of action ``index``'s token sequence."""
        path = self._paths.get(index)
        if path is None:
            node, out = self.root, []
            for token in self.sequences[index]:
                out.append(node.allowed)
                node = node.children[token]
            path = self._paths[index] = tuple(out)
        return path


_TRIES: weakref.WeakKeyDictionary[PolicyTokenizer, BoundedMemo[tuple[str, ...], ActionTrie]] = (
    weakref.WeakKeyDictionary()
)
"""Per tokenizer (for as long as it lives): legal set → its trie."""


def action_trie(legal: Sequence[str], tokenizer: PolicyTokenizer) -> ActionTrie:
    """The trie of ``legal``, built once per legal set and tokenizer: sampling, both
    re-scorings and the update of a step all ask for the same decisions'."""
    key = tuple(legal)
    memo = _TRIES.get(tokenizer)
    if memo is None:
        memo = _TRIES[tokenizer] = BoundedMemo(MEMO_SIZE)
    return memo.get(key, lambda: ActionTrie(key, tokenizer))
