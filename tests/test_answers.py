"""Answer extraction and normalization (SPEC §1.4 precedence)."""

from __future__ import annotations

from evosteer_core.answers import (
    cued_span,
    extract_answer,
    largest_code_block,
    last_boxed,
    normalize_answer,
)


def test_last_boxed_with_nested_braces_wins_over_everything():
    text = "Answer: 7\n```python\nprint(1)\n```\n\\boxed{1} then \\boxed{\\frac{1}{2}}"
    assert last_boxed(text) == "\\frac{1}{2}"
    assert extract_answer(text) == "\\frac{1}{2}"
    assert last_boxed("\\boxed{12} and an unclosed \\boxed{3") == "12"
    assert last_boxed("no box") is None


def test_cue_takes_the_rest_of_its_line_from_the_last_cue():
    text = "First the answer is 3.\nOn reflection, the **Answer: Paris** is right.\nThanks!"
    assert cued_span(text) == "Paris** is right."
    assert extract_answer("I think the answer is Marie Curie.\nHope that helps.") == "Marie Curie."
    assert extract_answer("Answer:\n\n  42\n") == "42"
    assert cued_span("Answer:   \n") is None


def test_cue_followed_by_a_code_block_gives_the_code():
    text = "The answer is:\n```python\ndef f():\n    return 1\n```\nDone."
    assert extract_answer(text) == "def f():\n    return 1"


def test_largest_code_block_then_last_line():
    text = "```\nx = 1\n```\nand the full program:\n```python\ndef f(x):\n    return x + 1\n```\nok"
    assert largest_code_block(text) == "def f(x):\n    return x + 1"
    assert extract_answer(text) == "def f(x):\n    return x + 1"
    assert extract_answer("Some reasoning.\nParis\n\n") == "Paris"
    assert extract_answer("   \n ") is None
    assert extract_answer("```\nunclosed") == "unclosed"


def test_normalize_answer_falls_back_to_whole_text_and_folds():
    assert normalize_answer("The answer is  PARIS\tFrance") == "paris france"
    assert normalize_answer("Reasoning...\nLine two\nStraße") == "reasoning... line two strasse"
    assert normalize_answer("\\boxed{ 42 }") == normalize_answer("answer: 42") == "42"
    # agreement survives re-normalizing an already extracted answer
    once = extract_answer("so the answer is Blue Whale")
    assert normalize_answer(once) == normalize_answer("so the answer is Blue Whale")
