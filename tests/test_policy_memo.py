"""The memoized prompt encodings and shared tries give exactly what a fresh computation gives."""

from __future__ import annotations

from evosteer_core.infra.memo import BoundedMemo
from evosteer_core.policy.render import SYSTEM_SEPARATOR
from evosteer_core.policy.tokenizer import PolicyTokenizer, load_tiny_tokenizer
from evosteer_core.policy.trie import ActionTrie, action_trie

LEGAL = ['{"kind":"STOP"}', '{"kind":"SET_OUTPUT","node_id":"n0"}', '{"kind":"ADD_EDGE"}']


def test_memoized_prompts_equal_a_fresh_encoding_and_are_the_callers_own():
    hf = load_tiny_tokenizer()
    prompt = "system text" + SYSTEM_SEPARATOR + "family: math\nnodes: n0 solver"
    tok = PolicyTokenizer(hf, max_prompt_tokens=1024)
    first = tok.encode_prompt(prompt)
    first.append(-1)  # the caller's list: changing it must not reach the memo
    again = tok.encode_prompt(prompt)
    body = list(hf.encode("family: math\nnodes: n0 solver", add_special_tokens=False))
    system = list(hf.encode("system text" + SYSTEM_SEPARATOR, add_special_tokens=False))
    assert again == system + body
    tok.max_prompt_tokens = len(system) + 3  # the limit is part of the memo's key
    assert tok.encode_prompt(prompt) == system + body[-3:]


def test_a_shared_trie_is_built_once_and_equals_a_fresh_one():
    tok = PolicyTokenizer(load_tiny_tokenizer(), max_prompt_tokens=1024)
    shared = action_trie(LEGAL, tok)
    assert action_trie(list(LEGAL), tok) is shared
    fresh = ActionTrie(LEGAL, tok)
    assert shared.sequences == fresh.sequences
    assert [shared.path_allowed(i) for i in range(3)] == [fresh.path_allowed(i) for i in range(3)]


def test_bounded_memo_drops_the_least_recently_used_entry():
    memo: BoundedMemo[str, int] = BoundedMemo(2)
    calls: list[str] = []

    def value(key: str) -> int:
        calls.append(key)
        return len(calls)

    assert memo.get("a", lambda: value("a")) == 1
    assert memo.get("b", lambda: value("b")) == 2
    assert memo.get("a", lambda: value("a")) == 1  # kept, and now the most recent
    memo.get("c", lambda: value("c"))  # drops b
    assert memo.get("a", lambda: value("a")) == 1
    assert memo.get("b", lambda: value("b")) == 4
    assert calls == ["a", "b", "c", "b"]
