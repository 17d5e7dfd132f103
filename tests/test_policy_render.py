"""Prompt renderers: full canonical JSON with clipped outputs, short compact text (docs/method.md §1.6)."""

from __future__ import annotations

import json

import pytest

from evosteer_core.infra.seeding import numpy_rng
from evosteer_core.policy.render import (
    OUTPUT_EDGE_CHARS,
    SYSTEM_FULL,
    SYSTEM_SEPARATOR,
    clip_output,
    feature_digits,
    render,
    render_compact,
    render_full,
)
from evosteer_core.policy.tokenizer import PolicyTokenizer, load_tiny_tokenizer
from experiments.vocabulary import random_public_state


def _state(seed: int) -> dict:
    return random_public_state(numpy_rng("test-render", seed))


def test_full_render_is_system_text_plus_canonical_state_json() -> None:
    state = _state(0)
    long_output = "A" * 2000 + "MIDDLE" + "Z" * 2000
    state["graph"]["nodes"].append(
        {
            "id": "n9",
            "role": "solver",
            "skills": [],
            "status": "ok",
            "answer": "4",
            "output": long_output,
        }
    )
    text = render_full(state)
    head, sep, body = text.partition(SYSTEM_SEPARATOR)
    assert head == SYSTEM_FULL and SYSTEM_SEPARATOR not in SYSTEM_FULL
    parsed = json.loads(body)
    assert body == json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    node = parsed["graph"]["nodes"][-1]
    assert node["output"].startswith("A" * OUTPUT_EDGE_CHARS) and node["output"].endswith(
        "Z" * OUTPUT_EDGE_CHARS
    )
    assert "MIDDLE" not in node["output"]
    expected = {**state, "graph": {**state["graph"], "nodes": parsed["graph"]["nodes"]}}
    assert parsed == expected
    assert state["graph"]["nodes"][-1]["output"] == long_output  # input not mutated


def test_clip_output_keeps_short_texts() -> None:
    assert clip_output(None) is None
    assert clip_output("x" * 2400) == "x" * 2400
    assert len(clip_output("x" * 5000)) < 2500


def test_compact_render_is_short_and_carries_the_key_facts() -> None:
    tok = PolicyTokenizer(load_tiny_tokenizer(), max_prompt_tokens=100_000)
    for seed in range(20):
        state = _state(seed)
        text = render_compact(state)
        assert f"family {state['family']}" in text
        assert "f " + feature_digits(state["features"]) in text
        for node in state["graph"]["nodes"]:
            assert f"{node['id']} {node['role']}" in text
        assert len(tok.encode_prompt(text)) < 400
    assert render(state, "compact") == render_compact(state)
    assert render(state, "full") == render_full(state)


def test_compact_no_task_is_the_compact_text_less_the_task_line() -> None:
    for seed in range(10):
        state = {**_state(seed), "task": f"[sim hotpotqa heldout #{seed}] Which river?"}
        full = render_compact(state).split("\n")
        blind = render(state, "compact_no_task").split("\n")
        assert [line for line in full if not line.startswith("task ")] == blind
        assert sum(line.startswith("task ") for line in full) == 1
        assert "heldout" not in "\n".join(blind)
        other = {**state, "task": "[sim hotpotqa train #3] Another question"}
        assert render(other, "compact_no_task") == render(state, "compact_no_task")


def test_bad_inputs_are_named() -> None:
    state = _state(1)
    with pytest.raises(ValueError, match="unknown renderer"):
        render(state, "tiny")
    with pytest.raises(ValueError, match="lacks keys"):
        render_full({k: v for k, v in state.items() if k != "budget"})
    with pytest.raises(ValueError, match="features"):
        render_compact({**state, "features": [0.0] * 29})


def test_feature_digits_round_each_feature_to_a_ninth() -> None:
    assert feature_digits([0.0, 1.0, 0.5, 0.06, 0.94, 2.0, -1.0]) == "0941890"
