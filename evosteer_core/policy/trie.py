"""The grammar mask: the legal actions' token sequences as a prefix-free trie (docs/method.md §1.6).

Every sequence ends with EOS, and EOS occurs nowhere else, so no sequence is a prefix of
another; a leaf (reached by EOS) names the action it spells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from evosteer_core.policy.tokenizer import PolicyTokenizer


@dataclass
class TrieNode:
    """One decoding position: the allowed next tokens, or the finished action at a leaf."""

    children: dict[int, TrieNode] = field(default_factory=dict)
    action: int = -1
    """Index into the legal list at a leaf (after EOS), else -1."""

    @property
    def allowed(self) -> tuple[int, ...]:
        """Allowed next token ids, sorted."""
        return tuple(sorted(self.children))


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
                node = node.children.setdefault(token, TrieNode())
            if node.children or node.action >= 0:
                raise ValueError(f"action {legal[index]!r} is not prefix-free in the trie")
            node.action = index

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
        node, out = self.root, []
        for token in self.sequences[index]:
            out.append(node.allowed)
            node = node.children[token]
        return tuple(out)
