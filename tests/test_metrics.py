"""Metric functions on hand-checked cases (expected values worked out by hand, not by the code)."""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

import pytest

from evosteer_core.benchmarks import metrics as m

# ---------------------------------------------------------------- SQuAD normalization / QA


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The  Eiffel Tower!", "eiffel tower"),
        ("an Apple a day", "apple day"),
        ("U.S.A.", "usa"),
        ("Theater", "theater"),  # "the" only as a whole word
        ("  Chief\tof\nProtocol ", "chief of protocol"),
        ("“Sunset Boulevard”", "sunset boulevard"),  # Unicode quotes are punctuation
        ("A", ""),
    ],
)
def test_normalize_squad(text: str, expected: str) -> None:
    assert m.normalize_squad(text) == expected


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Let me think.\nThe answer is Paris.", "Paris."),
        ("answer: London\nanswer: **Rome**", "Rome"),
        ("Some reasoning\n\nFinal Answer:\n  Berlin  \nbecause...", "Berlin"),
        ("Reasoning line\nMadrid\n\n", "Madrid"),
        ("", ""),
    ],
)
def test_final_answer_text(reply: str, expected: str) -> None:
    assert m.final_answer_text(reply) == expected


def test_exact_match_max_over_aliases_and_cue() -> None:
    aliases = ["Sunset Boulevard", "Sunset Blvd"]
    assert m.qa_exact_match("I recall it.\nThe answer is: sunset blvd.", aliases) == 1.0
    assert m.qa_exact_match("The answer is Sunset Strip", aliases) == 0.0
    # without a cue, the last line is the answer
    assert m.qa_exact_match("The musical was by Lloyd Webber.\nSunset Boulevard", aliases) == 1.0


def test_token_f1_hand_computed() -> None:
    # pred tokens {chief, of, protocol, office}, gold {chief, of, protocol}: P=3/4, R=1
    assert m.token_f1("the Chief of Protocol office", "Chief of Protocol") == pytest.approx(6 / 7)
    # multiset: pred "new new york" vs gold "new york": common = {new:1, york:1} = 2,
    # P = 2/3, R = 1 -> F1 = 0.8
    assert m.token_f1("new new york", "New York") == pytest.approx(0.8)
    assert m.token_f1("Paris", "London") == 0.0
    assert m.max_f1("York", ["New York", "york"]) == 1.0


def test_yes_no_answers() -> None:
    # official EM: "Yes, both are American." is not the answer "yes" ...
    assert m.qa_exact_match("Yes, both are American.", ["yes"]) == 0.0
    # ... unless the training-only leniency is asked for
    assert m.qa_exact_match("Yes, both are American.", ["yes"], yes_no_first_token=True) == 1.0
    assert m.qa_exact_match("No.", ["yes"], yes_no_first_token=True) == 0.0
    assert m.qa_exact_match("Yesterday.", ["yes"], yes_no_first_token=True) == 0.0
    assert m.qa_exact_match("Yes, it is.", ["Paris"], yes_no_first_token=True) == 0.0
    # SQuAD F1 gives partial credit; HotpotQA's rule gives none when either side is
    # yes/no/noanswer and the two differ
    assert m.token_f1("no", "no way") == pytest.approx(2 / 3)
    assert m.token_f1("no", "no way", hotpotqa=True) == 0.0
    assert m.token_f1("noanswer found", "noanswer", hotpotqa=True) == 0.0
    assert m.token_f1("yes they are", "no", hotpotqa=True) == 0.0
    assert m.token_f1("Yes!", "yes", hotpotqa=True) == 1.0
    assert m.qa_f1("answer: yes", ["yes"], hotpotqa=True) == 1.0


def test_squad_normalization_drops_ascii_symbols() -> None:
    """``string.punctuation`` includes symbols ($ + < = > ^ ` | ~) that are not Unicode P*."""
    assert m.qa_exact_match("answer: $5 million", ["5 million"]) == 1.0
    assert m.normalize_squad("a+b=c <x> ^y` |z| ~w") == "abc x y z w"
    assert m.token_f1("$5 million", "5 million") == 1.0


# An independent statement of the official SQuAD v1.1 evaluation (and HotpotQA's F1) from
# its published algorithm, used as the oracle for generated strings.
_OFFICIAL_PUNCT = str.maketrans("", "", string.punctuation)


def _official_normalize(s: str) -> str:
    s = s.lower().translate(_OFFICIAL_PUNCT)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _official_em(prediction: str, truth: str) -> float:
    return float(_official_normalize(prediction) == _official_normalize(truth))


def _official_f1(prediction: str, truth: str, hotpotqa: bool = False) -> float:
    p, t = _official_normalize(prediction), _official_normalize(truth)
    special = ("yes", "no", "noanswer")
    if hotpotqa and p != t and (p in special or t in special):
        return 0.0
    p_tok, t_tok = p.split(), t.split()
    same = sum((Counter(p_tok) & Counter(t_tok)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p_tok), same / len(t_tok)
    return 2 * precision * recall / (precision + recall)


_PIECES = (
    *string.punctuation,
    *("a", "an", "the", "A", "An", "THE", "The", "theater", "another", "ant", "anthem"),
    *("yes", "no", "Yes", "NO", "noanswer", "5", "$5", "million", "U.S.", "it's", "x-ray"),
    *(" ", "  ", "\t", "\n", "\r\n", "\x0b", "\x0c"),
)


def _generated(rng: random.Random) -> str:
    """A short string of words, articles (at every boundary), ASCII punctuation and mixed
    whitespace, glued with or without separators."""
    out = []
    for _ in range(rng.randint(0, 9)):
        out.append(rng.choice(_PIECES))
        out.append(rng.choice(("", " ", "", "\t", rng.choice(string.punctuation))))
    return "".join(out)


def test_em_f1_equal_the_official_squad_algorithm_on_generated_ascii() -> None:
    rng = random.Random(20261201)
    pairs = []
    for _ in range(4000):
        gold = _generated(rng)
        # predictions that share pieces with the gold make F1 non-trivial
        pred = gold if rng.random() < 0.2 else _generated(rng) + rng.choice(("", gold[:5], gold))
        pairs.append((pred, gold))
    seen = set("".join(p + g for p, g in pairs))
    assert set(string.punctuation) <= seen
    assert sum(_official_em(p, g) for p, g in pairs) > 400  # matches happen, not only misses
    for pred, gold in pairs:
        assert m.normalize_squad(pred) == _official_normalize(pred), repr(pred)
        assert m.exact_match(pred, [gold]) == _official_em(pred, gold), (pred, gold)
        assert m.token_f1(pred, gold) == pytest.approx(_official_f1(pred, gold)), (pred, gold)
        assert m.token_f1(pred, gold, hotpotqa=True) == pytest.approx(
            _official_f1(pred, gold, hotpotqa=True)
        ), (pred, gold)


# ---------------------------------------------------------------- MCQ


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Answer: (C)", "C"),
        ("C.", "C"),
        ("After weighing the options, the answer is C because of X.", "C"),
        ("the correct answer is option d.", "D"),
        ("**Answer:** B", "B"),
        ("I pick A first.\nOn reflection the answer is (b)", "B"),
        ("Reasoning...\n(E)", "E"),
        ("The answer is a fox", None),  # lowercase article, not a letter choice
        ("The answer is F", None),  # beyond the four options
        ("The answer is B.\nWait, no: the answer is a fox", None),  # only the last cue counts
        ("The answer is B.\nOn reflection the answer is D.", "D"),
        ("No letter here", None),
    ],
)
def test_extract_choice(reply: str, expected: str | None) -> None:
    assert m.extract_choice(reply, 4 if "F" in reply else 5) == expected


def test_mcq_correct_by_letter_or_option_text() -> None:
    choices = ["Ampicillin", "Ceftriaxone", "Nitrofurantoin"]
    assert m.mcq_correct("The answer is (C).", choices, "C") == 1.0
    assert m.mcq_correct("The answer is (B).", choices, "C") == 0.0
    assert m.mcq_correct("Answer: nitrofurantoin", choices, "C") == 1.0
    assert m.mcq_correct("I am not sure.", choices, "C") == 0.0


# ---------------------------------------------------------------- AIME integer


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("so $m+n = \\boxed{033}$.", 33),
        ("first \\boxed{12} then corrected: \\boxed{70}", 70),
        ("Working...\n#### 480", 480),
        ("The answer is 204, since 17 + 187 = 204.", 204),
        ("We get 5 apples and then 17 pears.", 17),
        ("\\boxed{12.0}", 12),
        ("\\boxed{\\frac{3}{4}}", None),
        ("nothing numeric", None),
    ],
)
def test_extract_integer(reply: str, expected: int | None) -> None:
    assert m.extract_integer(reply) == expected


def test_aime_correct_range_and_leading_zeros() -> None:
    assert m.aime_correct("\\boxed{033}", "33") == 1.0
    assert m.aime_correct("\\boxed{34}", "33") == 0.0
    assert m.aime_correct("The answer is 1033", "33") == 0.0
    assert m.aime_correct("The answer is -5", "5") == 0.0


# ---------------------------------------------------------------- MATH


def test_last_boxed_nested_braces() -> None:
    assert m.last_boxed("x \\boxed{\\frac{1}{2}} y \\boxed{\\sqrt{2}}") == "\\sqrt{2}"
    assert m.last_boxed("no box") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
        ("\\dfrac{5}{6}", "\\frac{5}{6}"),
        ("\\tfrac12", "\\frac{1}{2}"),
        ("10\\text{ cm}", "10"),
        ("90^\\circ", "90"),
        ("\\$18.90", "18.90"),
        ("x = 5", "5"),
        ("\\sqrt3", "\\sqrt{3}"),
        ("3/4", "\\frac{3}{4}"),
        ("50\\%", "50"),
        (".5", "0.5"),
        ("\\text{Devon}", "Devon"),
        ("1\\!000", "1000"),
    ],
)
def test_normalize_math(text: str, expected: str) -> None:
    assert m.normalize_math(text) == expected


@pytest.mark.parametrize(
    ("pred", "gold", "same"),
    [
        ("0.5", "\\frac{1}{2}", True),
        ("1/2", "\\dfrac{1}{2}", True),
        ("5.0", "5", True),
        ("-\\frac{3}{4}", "-0.75", True),
        ("\\frac{-3}{4}", "-\\frac34", True),
        ("1,000", "1000", True),
        ("\\left(1,2\\right)", "(1, 2)", True),
        ("12\\text{ inches}", "12", True),
        ("0.33", "\\frac{1}{3}", False),
        ("\\sqrt{2}", "2", False),
        ("\\frac{1}{0}", "0", False),
    ],
)
def test_math_equivalent(pred: str, gold: str, same: bool) -> None:
    assert m.math_equivalent(pred, gold) is same


def test_parse_number_exact() -> None:
    assert m.parse_number("-\\frac{6}{8}") == Fraction(-3, 4)
    assert m.parse_number("2.50") == Fraction(5, 2)
    assert m.parse_number("x+1") is None


def test_math_correct_from_reply() -> None:
    assert m.math_correct("so the sum is $\\boxed{\\dfrac{5}{6}}$.", ["\\frac{5}{6}"]) == 1.0
    assert m.math_correct("The answer is 0.5", ["\\frac{1}{2}"]) == 1.0
    assert m.math_correct("\\boxed{6}", ["5"]) == 0.0


# ---------------------------------------------------------------- code


def test_extract_program() -> None:
    reply = "Idea:\n```python\nx = 1\n```\nFull solution:\n```python\ndef f():\n    return 2\n```\n"
    assert m.extract_program(reply).strip() == "def f():\n    return 2"
    truncated = "Here:\n```python\ndef g():\n    return 3\n"
    assert m.extract_program(truncated) == "def g():\n    return 3\n"
    assert m.extract_program("def h(): return 4") == "def h(): return 4"


def test_complete_from_prompt() -> None:
    prompt = 'from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    """Sum."""\n'
    body = "    return sum(xs)\n"
    assert m.complete_from_prompt(prompt, body, "add") == prompt + body
    full = "def add(xs):\n    return sum(xs)\n"
    assert m.complete_from_prompt(prompt, full, "add") == "from typing import List\n\n\n" + full


HUMANEVAL_STYLE_TESTS = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
SCRIPT_TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"


def test_code_passes_both_test_styles() -> None:
    good = "def add(a, b):\n    return a + b\n"
    bad = "def add(a, b):\n    return a - b\n"
    assert m.code_passes(good, HUMANEVAL_STYLE_TESTS, "add") == 1.0
    assert m.code_passes(bad, HUMANEVAL_STYLE_TESTS, "add") == 0.0
    assert m.code_passes(good, SCRIPT_TESTS, "add") == 1.0
    assert m.code_passes(bad, SCRIPT_TESTS, "add") == 0.0
    assert m.code_passes("   ", SCRIPT_TESTS, "add") == 0.0


def test_code_passes_stops_runaway_program() -> None:
    loop = "def add(a, b):\n    while True:\n        pass\n"
    assert m.code_passes(loop, HUMANEVAL_STYLE_TESTS, "add", cpu_s=1, wall_s=3) == 0.0


# ---------------------------------------------------------------- interactive


@dataclass
class FinishedEpisode:
    """The end state of an environment episode (only what the success rule reads)."""

    max_steps: int
    steps_done: int
    done: bool
    success: bool


@pytest.mark.parametrize(
    ("state", "limit", "expected"),
    [
        (FinishedEpisode(50, 12, True, True), None, 1.0),
        (FinishedEpisode(50, 12, True, False), None, 0.0),
        (FinishedEpisode(50, 12, False, True), None, 0.0),
        (FinishedEpisode(60, 55, True, True), 50, 0.0),  # won, but after the 50-step limit
        (FinishedEpisode(60, 50, True, True), 50, 1.0),
    ],
)
def test_interactive_success(state: FinishedEpisode, limit: int | None, expected: float) -> None:
    assert m.interactive_success(state, limit) == expected  # type: ignore[arg-type]
