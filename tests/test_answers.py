"""Answer extraction and normalization (docs/method.md §1.4 precedence) and the stated-answer rule."""

from __future__ import annotations

import pytest

from evosteer_core.episode.answers import (
    cued_span,
    largest_code_block,
    last_boxed,
    normalize_answer,
    stated_answer,
)
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import RoleSpec, catalogue_from_dict, default_catalogue

CAT = default_catalogue()
SOLVER, TOOL_USER, PLANNER = (CAT.role(r) for r in ("solver", "tool_user", "planner"))
MATH = TaskRecord("m", "unit", "aime", "What is 6 times 7?", "aime", answers=("42",))
CODE = TaskRecord("c", "unit", "mbpp_plus", "Write f.", "code", tests="assert f() == 1\n")


def extract(text: str) -> str | None:
    """What a solver states in a code task (every explicit form counts there)."""
    return stated_answer(text, SOLVER, CODE, "ok")


def test_last_boxed_with_nested_braces_wins_over_everything():
    text = "Answer: 7\n```python\nprint(1)\n```\n\\boxed{1} then \\boxed{\\frac{1}{2}}"
    assert last_boxed(text) == "\\frac{1}{2}"
    assert extract(text) == "\\frac{1}{2}"
    assert last_boxed("\\boxed{12} and an unclosed \\boxed{3") == "12"
    assert last_boxed("no box") is None


def test_cue_takes_the_rest_of_its_line_from_the_last_cue():
    text = "First the answer is 3.\nOn reflection, the **Answer: Paris** is right.\nThanks!"
    assert cued_span(text) == "Paris** is right."
    assert extract("I think the answer is Marie Curie.\nHope that helps.") == "Marie Curie."
    assert extract("Answer:\n\n  42\n") == "42"
    assert cued_span("Answer:   \n") is None


def test_cue_followed_by_a_code_block_gives_the_code():
    text = "The answer is:\n```python\ndef f():\n    return 1\n```\nDone."
    assert extract(text) == "def f():\n    return 1"


def test_largest_code_block_then_last_line():
    text = "```\nx = 1\n```\nand the full program:\n```python\ndef f(x):\n    return x + 1\n```\nok"
    assert largest_code_block(text) == "def f(x):\n    return x + 1"
    assert extract(text) == "def f(x):\n    return x + 1"
    # no explicit form: a solver states nothing; a bare role states its last line
    assert extract("Some reasoning.\nParis\n\n") is None
    assert stated_answer("Some reasoning.\nParis\n\n", TOOL_USER, MATH, "ok") == "Paris"
    assert extract("   \n ") is None
    assert extract("```\nunclosed") is None


def test_normalize_answer_falls_back_to_whole_text_and_folds():
    assert normalize_answer("The answer is  PARIS\tFrance") == "paris france"
    assert normalize_answer("Reasoning...\nLine two\nStraße") == "reasoning... line two strasse"
    assert normalize_answer("\\boxed{ 42 }") == normalize_answer("answer: 42") == "42"
    # agreement survives re-normalizing an already extracted answer
    once = extract("so the answer is Blue Whale")
    assert normalize_answer(once) == normalize_answer("so the answer is Blue Whale")


def test_stated_answer_rule_by_role_task_and_status():
    plan = "Plan:\n1. Read the task.\n2. Answer: multiply 6 by 7."
    assert stated_answer(plan, PLANNER, MATH, "ok") is None  # a planner never answers
    assert stated_answer(plan, SOLVER, MATH, "ok") == "multiply 6 by 7."
    code = "Here:\n```python\ndef f():\n    return 1\n```"
    assert stated_answer(code, SOLVER, MATH, "ok") is None  # code blocks answer code tasks only
    assert stated_answer(code, SOLVER, CODE, "ok") == "def f():\n    return 1"
    # a cut-off reply's last line is no bare result; an explicit form still counts
    assert stated_answer("The result is 4", TOOL_USER, MATH, "truncated") is None
    assert stated_answer("The result is 4", TOOL_USER, MATH, "tool_error") == "The result is 4"
    assert stated_answer("so \\boxed{42} and then", TOOL_USER, MATH, "truncated") == "42"
    assert stated_answer("", TOOL_USER, MATH, "ok") is None


def test_answer_form_is_validated_with_the_role_named():
    with pytest.raises(ValueError, match="role 'x': answer_form must be one of"):
        RoleSpec("x", "do it", answer_form="sometimes")
    data = {
        "roles": [{"role_id": "x", "instruction": "i", "answer_form": "loud"}],
        "families": [{"family": fam.family, "tools": []} for fam in CAT.families],
    }
    with pytest.raises(ValueError, match="roles.yaml: malformed role catalogue: role 'x'"):
        catalogue_from_dict(data, where="roles.yaml")
    assert [r.answer_form for r in CAT.roles] == [
        "bare" if r.role_id == "tool_user" else "none" if r.role_id == "planner" else "explicit"
        for r in CAT.roles
    ]
