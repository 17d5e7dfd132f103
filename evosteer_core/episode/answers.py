"""Reading the answer a model output states (docs/method.md §1.4, §1.10), shared by executors,
features and metrics so that every part of the pipeline agrees on what "the answer" is.

Precedence: the last ``\\boxed{...}``, else the span after the last "answer:"/"answer is"
cue, else the largest fenced code block. ``stated_answer`` is the one rule by which both
executors decide whether a node states an answer (its role's ``answer_form``; see
docs/runtime.md); ``normalize_answer`` falls back to the whole text and casefolds and
collapses whitespace (answer agreement, feature 17).
"""

from __future__ import annotations

import re

from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import RoleSpec

_CUE = re.compile(r"answer\s*(?:is\b|:)", re.IGNORECASE)
_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)
_BOXED = "\\boxed{"


def last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` with balanced braces, or None."""
    start = text.rfind(_BOXED)
    while start != -1:
        depth, i = 1, start + len(_BOXED)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len(_BOXED) : i - 1].strip()
        start = text.rfind(_BOXED, 0, start)
    return None


def code_blocks(text: str) -> list[str]:
    """Contents of every closed fenced code block, in order."""
    return [m.group(1) for m in _FENCE.finditer(text)]


def largest_code_block(text: str) -> str | None:
    """The longest fenced code block (the later one on ties), or None."""
    blocks = code_blocks(text)
    if not blocks:
        return None
    return max(reversed(blocks), key=len).strip("\n")


def cued_span(text: str) -> str | None:
    """What follows the last "answer:"/"answer is" cue: a code block opening right after the
    cue, else the rest of the cue's line (or the next non-empty line when that is empty)."""
    matches = list(_CUE.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end() :].lstrip(" \t:")
    if rest.lstrip().startswith("```"):
        block = _FENCE.match(rest.lstrip())
        if block:
            return block.group(1).strip("\n")
    for line in rest.splitlines():
        span = line.strip().strip("*").strip()
        if span:
            return span
    return None


def _stated(text: str) -> str | None:
    for reader in (last_boxed, cued_span, largest_code_block):
        found = reader(text)
        if found:
            return found
    return None


COMPLETE_STATUSES = ("ok", "tool_error")
"""Statuses of a reply that ended by itself (a truncated reply's last line is cut off)."""


def stated_answer(text: str, role: RoleSpec, task: TaskRecord, status: str) -> str | None:
    """The answer a node's output states, or None (docs/method.md §1.4 "answer"; features 15 and 17).

    A planner (``answer_form`` none) never answers. Otherwise the answer is the last
    ``\\boxed{}``, else the span after the last "answer:"/"answer is" cue, else, in code
    tasks, the largest fenced code block. A ``bare`` role (tool_user, whose convention is the
    bare result) also answers with the last non-empty line of a complete reply.
    """
    if role.answer_form == "none":
        return None
    found = last_boxed(text) or cued_span(text)
    if not found and task.metric == "code":
        found = largest_code_block(text)
    if found:
        return found
    if role.answer_form == "bare" and status in COMPLETE_STATUSES:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return lines[-1] if lines else None
    return None


def normalize_answer(text: str) -> str:
    """Canonical form for comparing answers: boxed → cue → largest code block → whole text,
    then casefolded with whitespace runs collapsed to one space."""
    found = _stated(text) or text
    return " ".join(found.casefold().split())
