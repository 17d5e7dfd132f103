"""The episode reward R ∈ [0, 1] of one task (docs/method.md §1.10), scored once on the output node.

``evaluate`` dispatches on ``TaskRecord.metric``. Interactive records (ALFWorld, WebShop, and
SWE-bench Verified, whose official harness is an environment the agent works in; see
docs/benchmarks.md) are scored from the environment's final state, not from the text.
"""

from __future__ import annotations

from evosteer_core.benchmarks import metrics
from evosteer_core.episode.records import TaskRecord
from evosteer_core.executors.base import Environment


def _program(record: TaskRecord, answer_text: str) -> str:
    program = metrics.extract_program(answer_text)
    if record.meta.get("prompt_is_code"):
        program = metrics.complete_from_prompt(record.prompt, program, record.entry_point)
    return program


def evaluate(
    record: TaskRecord,
    answer_text: str | None,
    environment: Environment | None = None,
    *,
    yes_no_first_token: bool = False,
) -> float:
    """The reward of ``answer_text`` (the output node's text; None when it stated nothing).

    ``yes_no_first_token`` is the training-only QA leniency of ``reward.yes_no_first_token``
    (docs/benchmarks.md); evaluation always scores with the official rule (False).
    Raises ``ValueError`` for an interactive record without its environment: such a reward
    cannot be computed from text, and scoring it 0 would hide a wiring error.
    """
    if record.metric == "interactive":
        if environment is None:
            harness = record.meta.get("harness", record.source)
            raise ValueError(
                f"record {record.record_id!r} ({record.source}) is interactive: its reward is "
                f"the success of its {harness} environment, and none was given"
            )
        return metrics.interactive_success(environment, record.meta.get("max_steps"))
    if answer_text is None or not answer_text.strip():
        return 0.0
    if record.metric == "qa_em":
        return metrics.qa_exact_match(
            answer_text, record.answers, yes_no_first_token=yes_no_first_token
        )
    if record.metric == "mcq":
        return metrics.mcq_correct(answer_text, record.choices, record.answers[0])
    if record.metric == "aime":
        return metrics.aime_correct(answer_text, record.answers[0])
    if record.metric == "math":
        return metrics.math_correct(answer_text, record.answers)
    if record.metric == "code":
        program = _program(record, answer_text)
        return metrics.code_passes(program, record.tests, record.entry_point)
    raise ValueError(f"record {record.record_id!r}: no scorer for metric {record.metric!r}")


def f1(
    record: TaskRecord, answer_text: str | None, environment: Environment | None = None
) -> float:
    """Answer F1 for reporting: token F1 (max over aliases) for QA records, with HotpotQA's
    yes/no/noanswer rule on HotpotQA records; metrics without partial credit report their 0/1
    reward."""
    if record.metric != "qa_em":
        return evaluate(record, answer_text, environment)
    if answer_text is None:
        return 0.0
    return metrics.qa_f1(answer_text, record.answers, hotpotqa=record.source == "hotpotqa")
