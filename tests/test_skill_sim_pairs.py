"""Sequential skill tests on pairs rolled out in the sim suite (SIMULATED executor).

Each pair is two real episodes of the same sim record: ADD_AGENT(n0, solver, σ) → SET_OUTPUT →
STOP, against the same without σ (σ masked). The outcomes feed ``validation_round`` step by
step until it decides, as in training (docs/method.md §1.8).
"""

from __future__ import annotations

import math

from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.episode.actions import Action
from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.episode.runtime import Episode
from evosteer_core.sim import SimExecutor, make_sim_suite
from evosteer_core.sim.skills import LATENT_SKILLS, skill_effect
from evosteer_core.skills.library import SkillLibrary
from evosteer_core.skills.pairs import PairOutcome
from evosteer_core.skills.sequential import TestLedger
from evosteer_core.skills.skill import Skill
from evosteer_core.skills.validation import validation_round

FAMILY = "aime"
PAIRS_PER_STEP = 4
EXECUTOR = SimExecutor()
CATALOGUE = default_catalogue()
TASKS = make_sim_suite(60, seed=7, split="train")
TASKS = [t for t in TASKS if t.family == FAMILY]


def _latent(kind: str) -> Skill:
    def ok(effect: float) -> bool:
        return {"null": effect == 0, "helpful": effect >= 0.8, "harmful": effect <= -0.6}[kind]

    latent = next(x for x in LATENT_SKILLS if ok(skill_effect(x["name"], FAMILY)))
    return Skill.from_dict({**latent, "family": FAMILY}, where="latent skill")


def _arm(task, skill: Skill, treated: bool, key: str) -> float:
    ep = Episode(
        task,
        CATALOGUE,
        BudgetLimits(),
        EXECUTOR,
        evaluate,
        menu=(skill.view(),),
        run_seed=11,
        episode_key=key,
        masked_skills=() if treated else (skill.skill_id,),
    )
    sid = skill.skill_id if treated else None
    for a in (
        Action("ADD_AGENT", node_id="n0", role_id="solver", skill_id=sid),
        Action("SET_OUTPUT", node_id="n0"),
        Action("STOP"),
    ):
        ep.apply(a)
    return float(ep.reward)


def _run(skill: Skill, run: int, max_steps: int, shared_key: bool) -> tuple[str, int]:
    """Steps of pairs until the first decision on ``skill`` ("keep" if none by ``max_steps``)."""
    library, _ = SkillLibrary().admit(skill, 0, [])
    ledger = TestLedger()
    for step in range(1, max_steps + 1):
        pairs = []
        for k in range(PAIRS_PER_STEP):
            task = TASKS[(run * 7 + step * PAIRS_PER_STEP + k) % len(TASKS)]
            key = f"r{run}/s{step}/p{k}"
            plus = _arm(task, skill, True, key)
            minus = _arm(task, skill, False, key if shared_key else key + "/control")
            pairs.append(
                PairOutcome(task.record_id, FAMILY, skill.skill_id, "candidate", plus, minus)
            )
        library, ledger, report = validation_round(library, ledger, pairs, step)
        for _, _, decision in report.decisions:
            if decision in ("promote", "retire"):
                return decision, step
    return "keep", max_steps


def test_null_sim_skill_false_decisions_stay_within_alpha():
    """Independent arms (no common random numbers), so the null hypothesis is tested on noise."""
    skill = _latent("null")
    runs = 200
    wrong = sum(_run(skill, r, max_steps=6, shared_key=False)[0] != "keep" for r in range(runs))
    margin = 2.58 * math.sqrt(0.05 * 0.95 / runs)  # 99% normal margin on the rate
    assert wrong / runs <= 0.05 + margin


def test_helpful_sim_skill_is_promoted_and_harmful_retired():
    """Stated bound (docs/skills.md): decided within 40 steps of 4 pairs (160 pairs); measured
    12–20 steps to promote the helpful aime skill and 18–31 to retire the harmful one."""
    promoted = [_run(_latent("helpful"), r, max_steps=40, shared_key=True) for r in range(5)]
    retired = [_run(_latent("harmful"), r, max_steps=40, shared_key=True) for r in range(5)]
    assert all(d == "promote" for d, _ in promoted), promoted
    assert all(d == "retire" for d, _ in retired), retired
