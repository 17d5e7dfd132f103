"""Answer extraction and the sim suite's evaluator (SQuAD-style EM; environment success).

``sim_evaluator`` matches the runtime's ``Evaluator`` signature. It scores only what the sim
suite needs (metrics ``qa_em`` and ``interactive``); ``benchmarks.rewards`` is the general
evaluator for every benchmark.
"""

from __future__ import annotations

import re
import string

from evosteer_core.executors.base import Environment
from evosteer_core.records import TaskRecord

_CUE = re.compile(r"(?:answer\s*:|answer\s+is)", re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def stated_answer(text: str | None) -> str | None:
    """The text after the last ``Answer:``/``answer is`` cue, up to the end of its line."""
    if not text:
        return None
    matches = list(_CUE.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end() :].strip().splitlines()
    return rest[0].strip() if rest and rest[0].strip() else None


def normalize_answer(text: str) -> str:
    """SQuAD normalization: lowercase, drop punctuation and articles, collapse whitespace."""
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCT))
    return " ".join(text.split())


def sim_evaluator(task: TaskRecord, text: str | None, environment: Environment | None) -> float:
    """Reward in {0, 1}: environment success for ``interactive`` records, otherwise exact match
    of the stated answer (else the last line) against any gold alias after normalization."""
    if task.metric == "interactive":
        return float(environment is not None and environment.success)
    if task.metric != "qa_em":
        raise ValueError(
            f"sim_evaluator: record {task.record_id!r} has metric {task.metric!r}; "
            "only 'qa_em' and 'interactive' are sim metrics"
        )
    if not text:
        return 0.0
    answer = stated_answer(text)
    if answer is None:
        answer = text.strip().splitlines()[-1] if text.strip() else ""
    norm = normalize_answer(answer)
    return float(any(norm == normalize_answer(g) for g in task.answers))
