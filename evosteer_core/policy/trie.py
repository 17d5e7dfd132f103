"""The grammar mask: the legal actions' token sequences as a prefix-free trie (docs/method.md §1.6).

Every sequence ends with EOS, and EOS occurs nowhere else, so no sequence is a prefix of
another; a leaf (reached by EOS) names the action it spells.
"""

from __future__ import annotations

import weakref
from bisect import bisect_right
from collections.abc import Sequence
from operator import itemgetter

from evosteer_core.infra.memo import BoundedMemo
from evosteer_core.policy.tokenizer import MEMO_SIZE, PolicyTokenizer


class TrieNode:
    """One decoding position: the allowed next tokens, or the finished action at a leaf.

    A node is the run ``[lo, hi)`` of its trie's token sequences in sorted order that share
    its first ``depth`` tokens: sorted sequences with a common prefix are contiguous, and
    within such a run the token at ``depth`` never decreases, so a node's children are the
    runs of equal tokens there, found by bisection. Children are made when first asked for
    (a step walks one path of each trie, not all of it) and kept: tries are shared through
    :func:`action_trie` and never changed.
    """

    __slots__ = ("_trie", "_depth", "_lo", "_hi", "_children", "_allowed", "action")

    def __init__(self, trie: ActionTrie, depth: int, lo: int, hi: int) -> None:
        self._trie, self._depth, self._lo, self._hi = trie, depth, lo, hi
        self._children: dict[int, TrieNode] | None = None
        self._allowed: tuple[int, ...] = ()
        # the sequences are prefix-free, so a run holding a whole sequence holds only it
        self.action = trie.order[lo] if len(trie.sorted_sequences[lo]) == depth else -1
        """Index into the legal list at a leaf (after EOS), else -1."""

    @property
    def children(self) -> dict[int, TrieNode]:
        """Next token id → the node after it, in increasing token order."""
        if self._children is None:
            self._expand()
        return self._children  # type: ignore[return-value]

    @property
    def allowed(self) -> tuple[int, ...]:
        """Allowed next token ids, sorted."""
        if self._children is None:
            self._expand()
        return self._allowed

    def _expand(self) -> None:
        """Make the children: the runs of equal tokens at ``depth`` (none at a leaf)."""
        seqs, depth, children = self._trie.sorted_sequences, self._depth, {}
        lo, hi, token_at = self._lo, self._hi, itemgetter(self._depth)
        if self.action < 0:
            while lo < hi:
                token = seqs[lo][depth]
                end = bisect_right(seqs, token, lo, hi, key=token_at)
                children[token] = TrieNode(self._trie, depth + 1, lo, end)
                lo = end
        self._children, self._allowed = children, tuple(children)


class ActionTrie:
    """Token trie over a state's legal action texts.

    Every action's ids end with EOS and hold no other EOS, and distinct texts have distinct
    ids (``PolicyTokenizer.encode_action`` checks that they decode back to the text), so the
    sequences are prefix-free by construction.
    """

    def __init__(self, legal: Sequence[str], tokenizer: PolicyTokenizer) -> None:
        if not legal:
            raise ValueError("empty legal action set: nothing to sample or score")
        if len(set(legal)) != len(legal):
            raise ValueError(f"legal action set has duplicates: {sorted(legal)[:5]}...")
        self.legal = list(legal)
        self.sequences = [tokenizer.encode_action(text) for text in legal]
        self.order = sorted(range(len(legal)), key=self.sequences.__getitem__)
        """Legal-list indices in the sorted order of their token sequences."""
        self.sorted_sequences = [self.sequences[i] for i in self.order]
        self.root = TrieNode(self, 0, 0, len(legal))
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
