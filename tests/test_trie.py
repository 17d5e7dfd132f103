"""Grammar trie: prefix-free token sequences, forced positions, clear errors (docs/method.md §1.6)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from evosteer_core.infra.seeding import numpy_rng
from evosteer_core.policy.tokenizer import PolicyTokenizer, TokenizationError, load_tiny_tokenizer
from evosteer_core.policy.trie import ActionTrie
from experiments.vocabulary import random_legal_set


@pytest.fixture(scope="module")
def tok() -> PolicyTokenizer:
    return PolicyTokenizer(load_tiny_tokenizer(), max_prompt_tokens=1024)


def _walk(trie: ActionTrie, ids: tuple[int, ...]) -> int:
    node = trie.root
    for token in ids:
        assert token in node.children
        node = node.children[token]
    return node.action


def test_every_sequence_reaches_its_own_leaf(tok: PolicyTokenizer) -> None:
    rng = numpy_rng("test-trie")
    for _ in range(30):
        legal = random_legal_set(rng)
        if not legal:
            continue
        trie = ActionTrie(legal, tok)
        for index, ids in enumerate(trie.sequences):
            assert _walk(trie, ids) == index
            assert tok.hf.decode(list(ids[:-1])) == legal[index]
            for cut in range(1, len(ids)):  # prefix-free: no proper prefix is a leaf
                assert _walk(trie, ids[:cut]) == -1


def test_every_node_matches_a_brute_force_over_the_sequences(tok: PolicyTokenizer) -> None:
    """The bisected runs against the definition: at a prefix, the allowed tokens are the next
    tokens of exactly the sequences that start with it; a leaf is a whole sequence. Legal sets
    in shuffled order (the trie sorts internally; indices stay the legal list's)."""
    rng = numpy_rng("test-trie-brute-force")
    for _ in range(30):
        legal = [str(a) for a in rng.permutation(random_legal_set(rng))]
        if not legal:
            continue
        trie = ActionTrie(legal, tok)
        seqs = [tok.encode_action(text) for text in legal]
        assert list(trie.sequences) == seqs
        for index, ids in enumerate(seqs):
            node = trie.root
            for j, token in enumerate(ids):
                expected = sorted({s[j] for s in seqs if s[:j] == ids[:j]})
                assert node.allowed == tuple(expected) == tuple(sorted(node.children))
                assert node.action == -1
                assert trie.path_allowed(index)[j] == node.allowed
                node = node.children[token]
            assert node.action == index and node.children == {} and node.allowed == ()


def test_path_allowed_marks_forced_and_branching_positions(tok: PolicyTokenizer) -> None:
    legal = ['{"kind":"SET_OUTPUT","node_id":"n0"}', '{"kind":"SET_OUTPUT","node_id":"n1"}']
    trie = ActionTrie(legal, tok)
    allowed = trie.path_allowed(1)
    branching = [j for j, a in enumerate(allowed) if len(a) > 1]
    assert len(branching) == 1
    j = branching[0]
    assert set(allowed[j]) == {trie.sequences[0][j], trie.sequences[1][j]}
    single = ActionTrie(legal[:1], tok)
    assert all(len(a) == 1 for a in single.path_allowed(0))


def test_errors_are_clear(tok: PolicyTokenizer) -> None:
    with pytest.raises(ValueError, match="empty legal"):
        ActionTrie([], tok)
    with pytest.raises(ValueError, match="duplicates"):
        ActionTrie(['{"kind":"STOP"}', '{"kind":"STOP"}'], tok)
    with pytest.raises(ValueError, match="not in the legal set"):
        ActionTrie(['{"kind":"STOP"}'], tok).index_of('{"kind":"SET_OUTPUT","node_id":"n0"}')


def test_tokenizer_that_does_not_round_trip_is_rejected() -> None:
    word = Tokenizer(models.WordLevel({"[UNK]": 0, "<eos>": 1, "STOP": 2}, unk_token="[UNK]"))
    word.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=word, eos_token="<eos>", unk_token="[UNK]")
    with pytest.raises(TokenizationError, match="round-trip"):
        ActionTrie(['{"kind":"STOP"}'], PolicyTokenizer(hf, max_prompt_tokens=64))
