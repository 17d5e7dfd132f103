"""Answer scoring per metric (docs/method.md §1.10): SQuAD EM/F1, MCQ letter, AIME integer, MATH
final-value equivalence, code pass@1 in the sandbox, interactive success.

Each scorer takes the raw reply text of the output node, extracts the answer the way its
benchmark is usually graded, and compares it with the gold. ``rewards.evaluate`` dispatches
to these on ``TaskRecord.metric``.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

from evosteer_core.benchmarks.schema import CHOICE_LETTERS
from evosteer_core.episode.answers import cued_span, largest_code_block, last_boxed
from evosteer_core.executors.base import Environment
from evosteer_core.tools.sandbox import run_tests

# ---------------------------------------------------------------- final-answer extraction


def final_answer_text(reply: str) -> str:
    """The stated answer (docs/method.md §1.10): the span after the last "answer is"/"answer:" cue
    (``answers.cued_span``), else the last non-empty line."""
    cued = cued_span(reply)
    if cued is not None:
        return cued
    lines = [line.strip() for line in reply.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# ---------------------------------------------------------------- SQuAD EM / F1

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCTUATION = frozenset(string.punctuation)
_YES_NO = ("yes", "no")
_HOTPOTQA_SPECIAL = ("yes", "no", "noanswer")


def _is_punctuation(ch: str) -> bool:
    """SQuAD's set (every character of ``string.punctuation``, symbols such as ``$ + < = >``
    included) plus, as an extension beyond ASCII, every Unicode ``P*`` character."""
    return ch in _ASCII_PUNCTUATION or unicodedata.category(ch).startswith("P")


def normalize_squad(text: str) -> str:
    """SQuAD v1.1 answer normalization: lowercase, drop punctuation, drop the whole words
    a/an/the, collapse whitespace. On ASCII text this is the official algorithm exactly;
    non-ASCII punctuation (curly quotes, dashes) is also dropped (docs/benchmarks.md)."""
    text = "".join(ch for ch in text.lower() if not _is_punctuation(ch))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _prediction_for(prediction: str, gold: str, yes_no_first_token: bool) -> str:
    """Normalized prediction; with ``yes_no_first_token`` (a training-reward option, never
    used in evaluation) a reply opening "Yes, ..." counts as yes against a yes/no gold."""
    pred = normalize_squad(prediction)
    if yes_no_first_token and normalize_squad(gold) in _YES_NO:
        first = pred.split(" ", 1)[0]
        if first in _YES_NO:
            return first
    return pred


def exact_match(
    prediction: str, aliases: Sequence[str], *, yes_no_first_token: bool = False
) -> float:
    """1.0 iff the normalized prediction equals some normalized alias (official SQuAD and
    HotpotQA EM unless ``yes_no_first_token``)."""
    return max(
        (
            float(_prediction_for(prediction, g, yes_no_first_token) == normalize_squad(g))
            for g in aliases
        ),
        default=0.0,
    )


def token_f1(prediction: str, gold: str, *, hotpotqa: bool = False) -> float:
    """Multiset token-overlap F1 of normalized texts, as SQuAD v1.1 computes it (no common
    token, empty sides included, gives 0). ``hotpotqa`` adds HotpotQA's rule: when either
    side normalizes to yes, no or noanswer, F1 is 0 unless both sides are equal."""
    pred, ref = normalize_squad(prediction), normalize_squad(gold)
    if hotpotqa and (pred in _HOTPOTQA_SPECIAL or ref in _HOTPOTQA_SPECIAL) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    common = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def max_f1(prediction: str, aliases: Sequence[str], *, hotpotqa: bool = False) -> float:
    """Token F1 against the best-matching alias."""
    return max((token_f1(prediction, g, hotpotqa=hotpotqa) for g in aliases), default=0.0)


def qa_exact_match(
    reply: str, aliases: Sequence[str], *, yes_no_first_token: bool = False
) -> float:
    """QA reward: EM of the extracted final answer, max over aliases."""
    return exact_match(final_answer_text(reply), aliases, yes_no_first_token=yes_no_first_token)


def qa_f1(reply: str, aliases: Sequence[str], *, hotpotqa: bool = False) -> float:
    """QA F1 (reported, not trained on) of the extracted final answer, max over aliases."""
    return max_f1(final_answer_text(reply), aliases, hotpotqa=hotpotqa)


# ---------------------------------------------------------------- multiple choice

_LETTER = r"[(\[{*]*\s*([A-Ja-j])(?![A-Za-z0-9])\s*[)\]}*]*"
_CUE_LETTER = re.compile(
    r"answer\s*(?:is\b|:|=)[\s*:]*(?:(?:option|choice)\s*)?" + _LETTER + r"(?P<after>[^\n]*)",
    re.IGNORECASE,
)
_LINE_LETTER = re.compile(r"(?:(?:option|choice)\s*)?" + _LETTER + r"\s*[.:]?", re.IGNORECASE)
_TRAILER_OK = re.compile(r"\s*[.:,;)\]]?\s*$")


def extract_choice(reply: str, n_choices: int) -> str | None:
    """The option letter a reply chooses, or None.

    The last cue followed by a letter decides ("Answer: (C)", "the answer is C", "answer:
    option c."; a letter beyond the options chooses nothing). A lowercase letter after a cue
    counts only when nothing but punctuation follows it ("the answer is a fox" is no
    choice). Without a cue, the last line that is only a letter ("C.", "(C)", "**C**").
    """
    letters = CHOICE_LETTERS[:n_choices]
    cues = list(_CUE_LETTER.finditer(reply))
    if cues:
        letter, after = cues[-1].group(1), cues[-1].group("after")
        if letter.isupper() or _TRAILER_OK.match(after):
            return letter.upper() if letter.upper() in letters else None
    for line in reversed(reply.splitlines()):
        match = _LINE_LETTER.fullmatch(line.strip())
        if match and match.group(1).upper() in letters:
            return match.group(1).upper()
    return None


def mcq_correct(reply: str, choices: Sequence[str], gold_letter: str) -> float:
    """1.0 iff the chosen letter is the gold letter; a final answer that repeats an option's
    text (SQuAD-normalized) chooses that option when no letter is stated."""
    chosen = extract_choice(reply, len(choices))
    if chosen is None:
        final = normalize_squad(final_answer_text(reply))
        texts = [normalize_squad(c) for c in choices]
        if final and texts.count(final) == 1:
            chosen = CHOICE_LETTERS[texts.index(final)]
    return float(chosen == gold_letter.upper())


# ---------------------------------------------------------------- numbers / AIME

_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
_HASHES = re.compile(r"####\s*(\S+)")


def parse_number(text: str) -> Fraction | None:
    """An exact number from a decimal ("0.5", "-3", "1,000", "12.0"), a fraction "a/b",
    or ``\\frac{a}{b}`` (optionally signed); None for anything else."""
    text = text.strip()
    frac = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", text) or re.fullmatch(
        r"(-?)(-?\d+)/(-?\d+)", text
    )
    if frac:
        num, den = int(frac.group(2)), int(frac.group(3))
        if den == 0:
            return None
        value = Fraction(num, den)
        return -value if frac.group(1) else value
    if _NUMBER.fullmatch(text):
        return Fraction(text.replace(",", ""))
    return None


def _as_aime_integer(text: str) -> int | None:
    value = parse_number(normalize_math(text))
    if value is None or value.denominator != 1:
        return None
    return int(value)


def extract_integer(reply: str) -> int | None:
    """AIME answer: the last ``\\boxed{}``, else the last ``#### N``, else the first number
    after the last answer cue, else the last number in the reply; None if none is an integer
    ("033" is 33, "12.0" is 12)."""
    boxed = last_boxed(reply)
    if boxed is not None:
        return _as_aime_integer(boxed)
    hashes = _HASHES.findall(reply)
    if hashes:
        return _as_aime_integer(hashes[-1])
    cued = _NUMBER.search(cued_span(reply) or "")
    if cued:
        return _as_aime_integer(cued.group(0))
    numbers = _NUMBER.findall(reply)
    return _as_aime_integer(numbers[-1]) if numbers else None


def aime_correct(reply: str, gold: str) -> float:
    """1.0 iff the extracted integer lies in 0..999 and equals the gold integer."""
    value = extract_integer(reply)
    return float(value is not None and 0 <= value <= 999 and value == int(gold))


# ---------------------------------------------------------------- MATH equivalence

_UNIT_TEXT = re.compile(r"\\(?:text|mbox|mathrm)\{\s*[A-Za-z][A-Za-z .]*\}(?:\^\{?[23]\}?)?$")
_TEXT_WRAP = re.compile(r"^\\(?:text|textbf|mathrm|mbox)\{(.*)\}$")


def _fix_fracs(text: str) -> str:
    """Brace the arguments of ``\\frac12`` / ``\\frac1{2}`` / ``\\frac{1}2``."""
    out, rest = [], text
    while "\\frac" in rest:
        head, rest = rest.split("\\frac", 1)
        out.append(head + "\\frac")
        for _ in range(2):
            if rest.startswith("{"):
                depth = 0
                for i, ch in enumerate(rest):
                    depth += {"{": 1, "}": -1}.get(ch, 0)
                    if depth == 0:
                        out.append(rest[: i + 1])
                        rest = rest[i + 1 :]
                        break
                else:
                    out.append(rest)
                    rest = ""
            elif rest:
                out.append("{" + rest[0] + "}")
                rest = rest[1:]
    return "".join(out) + rest


def normalize_math(text: str) -> str:
    """Hendrycks-style normalization of a final MATH value.

    Drops line breaks, ``\\!``, ``\\,``, ``\\left``/``\\right``, degree marks, dollar signs,
    ``\\%``, a trailing unit in ``\\text{...}``, a short "x =" prefix and all spaces; maps
    ``\\dfrac``/``\\tfrac`` to ``\\frac``, braces ``\\frac12`` and ``\\sqrt3``, writes an
    integer ratio ``a/b`` as ``\\frac{a}{b}`` and adds a 0 before a leading decimal point.
    """
    s = text.replace("\n", "").strip()
    s = s.replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\ ", " ")
    s = s.replace("\\\\", "\\").replace("\\displaystyle", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("°", "")
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = s.strip()
    unit = _UNIT_TEXT.search(s)
    if unit and unit.start() > 0:
        s = s[: unit.start()]
    wrapped = _TEXT_WRAP.match(s.strip())
    if wrapped:
        s = wrapped.group(1)
    if "=" in s and s.count("=") == 1 and len(s.split("=")[0].strip()) <= 2:
        s = s.split("=")[1]
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = s.replace(" ", "")
    s = s.replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    s = _fix_fracs(s)
    ratio = re.fullmatch(r"(-?\d+)/(\d+)", s)
    if ratio:
        s = f"\\frac{{{ratio.group(1)}}}{{{ratio.group(2)}}}"
    return s.rstrip(".")


def math_equivalent(prediction: str, gold: str) -> bool:
    """Same normalized string, or the same exact number ("0.5" = "\\frac{1}{2}" = "1/2")."""
    pred, ref = normalize_math(prediction), normalize_math(gold)
    if pred == ref:
        return True
    pred_value, ref_value = parse_number(pred), parse_number(ref)
    return pred_value is not None and pred_value == ref_value


def final_math_answer(reply: str) -> str:
    """A reply's final value: the last ``\\boxed{}``, else the final answer text."""
    boxed = last_boxed(reply)
    return boxed if boxed is not None else final_answer_text(reply)


def math_correct(reply: str, aliases: Sequence[str]) -> float:
    """1.0 iff the reply's final value is equivalent to some gold value."""
    final = final_math_answer(reply)
    return float(bool(final) and any(math_equivalent(final, g) for g in aliases))


# ---------------------------------------------------------------- code

_OPEN_FENCE = re.compile(r"```[^\n`]*\n(.*)\Z", re.DOTALL)


def extract_program(reply: str) -> str:
    """The program in a reply: the largest fenced block (``answers.largest_code_block``);
    else the text after an unterminated opening fence (a truncated reply); else the whole
    text."""
    block = largest_code_block(reply)
    if block is not None:
        return block
    tail = _OPEN_FENCE.search(reply)
    return tail.group(1) if tail else reply


def complete_from_prompt(prompt_code: str, program: str, entry_point: str) -> str:
    """Join a code prompt (HumanEval: imports, helpers, the signature and docstring) with a
    reply: a full definition of ``entry_point`` gets the prompt's preamble before it; anything
    else is taken as the function body that continues the prompt."""
    definition = re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", prompt_code, re.M)
    if re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", program, re.M):
        preamble = prompt_code[: definition.start()] if definition else ""
        return preamble + program
    return prompt_code + program


def code_passes(program: str, tests: str, entry_point: str, **limits: object) -> float:
    """pass@1 of one program: 1.0 iff every hidden test ran and passed in the sandbox.

    ``tools.sandbox.run_tests`` runs HumanEval-style tests (``check(candidate)``) and script
    tests (MBPP+: asserts at top level) in a separate process from the program, and counts a
    pass only when the tests process proves it reached the end (docs/executors.md, "Code
    reward"); an early exit, a signal or a tampered comparison is a fail.
    """
    if not program.strip():
        return 0.0
    return float(run_tests(program, tests, entry_point, **limits).tests_passed is True)


# ---------------------------------------------------------------- interactive


def interactive_success(environment: Environment, max_steps: int | None = None) -> float:
    """1.0 iff the episode is done and won within the step limit (``max_steps`` when given,
    else the environment's own)."""
    limit = environment.max_steps if max_steps is None else min(max_steps, environment.max_steps)
    won = environment.done and environment.success and environment.steps_done <= limit
    return float(won)
