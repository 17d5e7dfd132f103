"""SIMULATED executor: each orchestration effect, shown statistically on seeded draws.

Each test compares two conditions over a few hundred tasks with the same seed keys (common
random numbers), and asserts a difference several standard errors wide.
"""

from __future__ import annotations

import functools
import statistics

import pytest
from test_sim import request

from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.episode.answers import cued_span
from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.episode.runtime import Episode
from evosteer_core.executors.base import Evidence, Message, SkillView
from evosteer_core.sim import SimExecutor, make_sim_record

EX = SimExecutor()
N = 300


@functools.cache
def family_tasks(family: str, n: int = N) -> tuple:
    return tuple(make_sim_record(family, i, 11, "train") for i in range(n))


def accuracy(tasks, results) -> float:
    return statistics.fmean(r.answer == t.answers[0] for t, r in zip(tasks, results, strict=True))


def skill(name: str) -> SkillView:
    return SkillView(skill_id=f"evosteer-{abs(hash(name)) % 10**20:020d}", name=name, rendered=name)


def solver_message(task, answer: str, evidence: tuple[Evidence, ...] = ()) -> tuple[Message, ...]:
    return (Message("n0", "revise", f"Worked it out.\nAnswer: {answer}", answer, evidence),)


def test_verifier_with_python_raises_accuracy_in_aime():
    tasks = family_tasks("aime")
    solved = [EX.run_node(request(t)) for t in tasks]
    verified = [
        EX.run_node(request(t, "verifier", node="n1", messages=solver_message(t, s.answer)))
        if s.answer
        else s
        for t, s in zip(tasks, solved, strict=True)
    ]
    assert accuracy(tasks, verified) > accuracy(tasks, solved) + 0.12
    # the python checks are recorded as tool uses and exec_check evidence
    with_msgs = [v for v, s in zip(verified, solved, strict=True) if s.answer]
    assert all(v.tool_calls == len(v.tool_uses) >= 1 for v in with_msgs if v.status == "ok")
    assert all(e.kind == "exec_check" for v in with_msgs for e in v.evidence)
    # checks pass on correct answers and mostly fail on wrong ones, the trap included
    checked = [
        (s.answer == t.answers[0], s.answer == t.meta["trap_answer"], v.evidence[0].passed)
        for t, s, v in zip(tasks, solved, verified, strict=True)
        if s.answer and v.evidence
    ]
    on_gold = [p for gold, _, p in checked if gold]
    on_trap = [p for gold, trap, p in checked if trap]
    assert statistics.fmean(on_gold) > 0.85 and statistics.fmean(on_trap) < 0.3


def test_skills_shift_accuracy_in_the_signed_direction():
    tasks = family_tasks("aime")
    base = accuracy(tasks, [EX.run_node(request(t)) for t in tasks])
    helped = accuracy(
        tasks, [EX.run_node(request(t, skills=(skill("residue sanity check"),))) for t in tasks]
    )
    hurt = accuracy(
        tasks, [EX.run_node(request(t, skills=(skill("small-case pattern guess"),))) for t in tasks]
    )
    null = accuracy(
        tasks, [EX.run_node(request(t, skills=(skill("verbose justification"),))) for t in tasks]
    )
    assert helped > base + 0.1 and hurt < base - 0.08
    # a null skill changes only the prompt length, never the draws that decide correctness
    assert null == base


def test_solver_adopts_revise_message_answers_right_or_wrong():
    tasks = family_tasks("hotpotqa")
    wrong = [t.meta["distractors"][0] for t in tasks]
    own = [EX.run_node(request(t, node="n1")) for t in tasks]
    told = [
        EX.run_node(request(t, node="n1", messages=solver_message(t, w)))
        for t, w in zip(tasks, wrong, strict=True)
    ]
    rate_own = statistics.fmean(r.answer == w for r, w in zip(own, wrong, strict=True))
    rate_told = statistics.fmean(r.answer == w for r, w in zip(told, wrong, strict=True))
    assert rate_told > rate_own + 0.3  # a wrong message answer propagates
    right = [
        EX.run_node(request(t, node="n1", messages=solver_message(t, t.answers[0]))) for t in tasks
    ]
    assert accuracy(tasks, right) > accuracy(tasks, own) + 0.2  # so does a right one


def test_planner_message_raises_downstream_solver_accuracy():
    tasks = family_tasks("hotpotqa")
    good_plan = [
        (Message("n0", "feedback", f"Plan:\n1. {t.meta['key_step']}.\n2. Answer.", None),)
        for t in tasks
    ]
    vague_plan = [(Message("n0", "feedback", "Plan:\n1. Think.\n2. Answer.", None),)] * len(tasks)
    with_plan = [
        EX.run_node(request(t, node="n1", messages=m))
        for t, m in zip(tasks, good_plan, strict=True)
    ]
    vague = [
        EX.run_node(request(t, node="n1", messages=m))
        for t, m in zip(tasks, vague_plan, strict=True)
    ]
    assert accuracy(tasks, with_plan) > accuracy(tasks, vague) + 0.1


def test_researcher_search_gives_retrieval_evidence_and_accuracy():
    tasks = family_tasks("nq_open")
    res = [EX.run_node(request(t, "researcher")) for t in tasks]
    assert all(r.tool_uses and all(u.tool == "search" for u in r.tool_uses) for r in res)
    found = [any(e.kind == "retrieval" and e.passed for e in r.evidence) for r in res]
    acc_found = statistics.fmean(
        r.answer == t.answers[0] for t, r, f in zip(tasks, res, found, strict=True) if f
    )
    acc_not = statistics.fmean(
        r.answer == t.answers[0] for t, r, f in zip(tasks, res, found, strict=True) if not f
    )
    assert 0.2 < statistics.fmean(found) < 0.9 and acc_found > acc_not + 0.2


def test_wrong_answers_split_into_shared_trap_and_disagreeing_distractors():
    tasks = family_tasks("medqa")
    a = [EX.run_node(request(t, node="n0")) for t in tasks]
    b = [EX.run_node(request(t, node="n1")) for t in tasks]
    both_wrong = [
        (x.answer, y.answer, t.meta["trap_answer"])
        for t, x, y in zip(tasks, a, b, strict=True)
        if x.answer and y.answer and t.answers[0] not in (x.answer, y.answer)
    ]
    agree = [x == y for x, y, _ in both_wrong]
    assert 0.15 < statistics.fmean(agree) < 0.9  # plausible shared errors exist, not always
    shared = [x == trap for (x, _, trap), same in zip(both_wrong, agree, strict=True) if same]
    assert statistics.fmean(shared) > 0.7  # agreeing wrong answers are mostly the trap
    # disagreement between independent nodes signals errors: agreeing pairs are more often right
    pairs = [(x.answer, y.answer, t.answers[0]) for t, x, y in zip(tasks, a, b, strict=True)]
    right_if_agree = statistics.fmean(x == g for x, y, g in pairs if x == y)
    right_if_not = statistics.fmean(x == g for x, y, g in pairs if x != y)
    assert right_if_agree > right_if_not + 0.2


def test_rerun_without_inputs_second_guesses_in_hotpotqa():
    tasks = family_tasks("hotpotqa")
    first = [EX.run_node(request(t)) for t in tasks]
    rerun = [
        EX.run_node(request(t, call=1, previous=f.text)) for t, f in zip(tasks, first, strict=True)
    ]
    fresh = [EX.run_node(request(t, call=1)) for t in tasks]
    assert accuracy(tasks, rerun) < accuracy(tasks, fresh) - 0.1


def test_finalizer_prefers_answers_with_passed_checks():
    tasks = family_tasks("mbpp_plus", 100)
    results = []
    for t in tasks:
        trap = t.meta["trap_answer"]
        msgs = (
            Message("n0", "feedback", f"Answer: {trap}", trap),
            Message("n1", "feedback", f"Answer: {trap}", trap),
            Message(
                "n2",
                "feedback",
                f"Answer: {t.answers[0]}",
                t.answers[0],
                (Evidence("exec_check", True),),
            ),
        )
        results.append(EX.run_node(request(t, "finalizer", node="n3", messages=msgs)))
    assert accuracy(tasks, results) > 0.75


def test_interactive_chain_beats_single_through_the_runtime():
    tasks = family_tasks("alfworld", 120)
    cat = default_catalogue()
    from evosteer_core.episode.actions import Action

    def play(task, roles):
        ep = Episode(
            task, cat, BudgetLimits(), EX, evaluate, run_seed=3, episode_key=task.record_id
        )
        ep.apply(Action("ADD_AGENT", node_id="n0", role_id=roles[0]))
        ep.apply(Action("SET_OUTPUT", node_id="n0"))
        if len(roles) > 1:
            ep.apply(Action("ADD_AGENT", node_id="n1", role_id=roles[1]))
            ep.apply(Action("ADD_EDGE", source_id="n0", target_id="n1", protocol="revise"))
        while not ep.stopped:
            legal = ep.legal_actions()
            stop, rerun = Action("STOP"), Action("RERUN_AGENT", node_id="n0")
            ep.apply(stop if stop in legal else rerun if rerun in legal else legal[0])
        assert ep.environment.steps_done <= 50 and ep.ledger.env_steps == ep.environment.steps_done
        return ep.reward

    single = statistics.fmean(play(t, ["solver"]) for t in tasks)
    chain = statistics.fmean(play(t, ["solver", "verifier"]) for t in tasks)
    assert chain > single + 0.08
    assert cued_span("x\nAnswer: done") == "done"


def test_orchestration_effect_scales_team_logits_and_keeps_family_means():
    base = SimExecutor().model
    assert base.with_orchestration_effect(1.0) is base
    for scale in (0.0, 3.0):
        scaled = base.with_orchestration_effect(scale)
        assert scaled.crowding == base.crowding * scale
        assert scaled.resolve_bonus == base.resolve_bonus * scale
        for name, fam in base.families.items():
            new = scaled.families[name]
            assert new.plan_bonus == fam.plan_bonus * scale
            assert new.search_bonus == fam.search_bonus * scale
            assert new.self_revision == fam.self_revision * scale
            assert new.context_bonus == fam.context_bonus * scale
            mean = statistics.fmean(fam.competence.values())
            assert statistics.fmean(new.competence.values()) == pytest.approx(mean)
            for role, c in fam.competence.items():
                assert new.competence[role] == pytest.approx(mean + scale * (c - mean))
            # what the team does not decide stays as it was
            assert (new.detect, new.search_hit, new.slope) == (
                fam.detect,
                fam.search_hit,
                fam.slope,
            )
    with pytest.raises(ValueError, match="must be >= 0"):
        base.with_orchestration_effect(-1.0)


def test_larger_orchestration_effect_widens_the_gap_a_plan_makes():
    tasks = family_tasks("hotpotqa")

    def plan_gap(executor: SimExecutor) -> float:
        plan = [
            (Message("n0", "feedback", f"Plan:\n1. {t.meta['key_step']}.", None),) for t in tasks
        ]
        with_plan = [
            executor.run_node(request(t, node="n1", messages=m))
            for t, m in zip(tasks, plan, strict=True)
        ]
        alone = [executor.run_node(request(t, node="n1")) for t in tasks]
        return accuracy(tasks, with_plan) - accuracy(tasks, alone)

    assert plan_gap(SimExecutor(EX.model.with_orchestration_effect(3.0))) > plan_gap(EX) + 0.1
