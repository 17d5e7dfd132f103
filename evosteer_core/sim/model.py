"""Parameters of the SIMULATED executor's generative model (documented in docs/sim.md).

Every number here is a design choice of the simulation, tuned so that orchestration matters
(``experiments/sim_paradigms.py``); none is measured from a real model. Competences are logits
at mid difficulty: a node's own attempt succeeds with probability
``sigmoid(competence[role] - slope * (difficulty - 0.5) + bonuses)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

ANSWER_ROLES: tuple[str, ...] = ("solver", "verifier", "researcher", "finalizer", "tool_user")
"""Roles whose output states an answer (the planner only plans)."""


def _frozen(d: dict[str, float]) -> Mapping[str, float]:
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class FamilyModel:
    """How one family's simulated agents behave.

    ``competence``: role -> logit of a correct own attempt at difficulty 0.5 (in the
    interactive family: of a correct environment command per step).
    ``adopt``: role -> probability of taking over an inbound message's answer instead of
    attempting the task itself (finalizer: of aggregating its inputs).
    ``plan_quality``/``plan_bonus``: probability that a planner's plan names the task's key
    step, and the logit a recipient of such a plan gains.
    ``search_hit``/``search_bonus``: probability that one search call finds supporting text
    (times ``1 - difficulty/2``) and the logit gained from it.
    ``tool_user_hit``: probability (times ``1 - difficulty/2``) that a tool_user's single
    search or python call returns the answer itself.
    ``detect``/``detect_trap``/``false_reject``: a verifier judging a candidate without an
    executable check rejects a wrong answer, the plausible trap answer, a correct answer.
    ``check_catches_trap``/``check_false_fail``: an executable check (python) fails on the
    trap answer / on the correct answer (other wrong answers fail with ``check_wrong_pass``'s
    complement).
    ``context_bonus``: interactive family: logit a node gains per step when it has inbound
    messages or its own previous output (it knows what has been done).
    ``self_revision``: logit added to an own attempt that sees only the node's previous output
    (a rerun without new inputs): negative where models second-guess themselves.
    ``out_tokens``: multiplier on every role's mean output tokens.
    """

    competence: Mapping[str, float]
    adopt: Mapping[str, float]
    slope: float = 2.5
    plan_quality: float = 0.6
    plan_bonus: float = 0.6
    search_hit: float = 0.0
    search_bonus: float = 0.0
    tool_user_hit: float = 0.0
    detect: float = 0.5
    detect_trap: float = 0.2
    false_reject: float = 0.15
    check_catches_trap: float = 0.9
    check_false_fail: float = 0.05
    check_wrong_pass: float = 0.03
    context_bonus: float = 0.0
    self_revision: float = 0.0
    out_tokens: float = 1.0


@dataclass(frozen=True)
class SimModel:
    """All parameters of the simulated executor (family tables plus global constants)."""

    families: Mapping[str, FamilyModel]
    out_tokens: Mapping[str, float] = field(
        default_factory=lambda: _frozen(
            {
                "solver": 380.0,
                "verifier": 260.0,
                "planner": 170.0,
                "researcher": 220.0,
                "finalizer": 110.0,
                "tool_user": 90.0,
            }
        )
    )
    """Mean output tokens per model call of each role (times the family's ``out_tokens``)."""
    step_out_tokens: float = 28.0
    """Mean output tokens per environment command."""
    tool_result_tokens: int = 150
    """Tokens a tool result adds to every later model call's input in the same execution."""
    step_obs_tokens: int = 40
    """Tokens each environment observation adds to the next step's input."""
    chars_per_token: float = 4.0
    parse_error: float = 0.015
    """Probability that a call's output cannot be parsed (no answer stated)."""
    ramble: float = 0.006
    """Probability that a call rambles up to its output-token limit (status ``truncated``)."""
    tool_failure: float = 0.04
    """Probability that one tool call errors (search timeout, sandbox crash)."""
    crowding: float = 0.25
    """Logit lost per inbound message beyond the second (long, conflicting context)."""
    resolve_bonus: float = 0.3
    """Logit a verifier gains when it re-solves after rejecting candidates (it knows they fail)."""
    env_regress: float = 0.25
    """Share of wrong environment commands that undo the last completed subgoal."""
    env_invalid: float = 0.4
    """Share of wrong environment commands that the environment rejects (``ok=False``)."""
    env_slip: float = 0.05
    """Probability that a correct environment command fails anyway (stuck drawer)."""
    latency_per_call_s: float = 0.35
    latency_per_out_token_s: float = 1.0 / 60.0
    latency_per_in_token_s: float = 1.0 / 5000.0
    latency_per_tool_s: Mapping[str, float] = field(
        default_factory=lambda: _frozen({"python": 0.9, "search": 0.4})
    )
    latency_per_env_step_s: float = 0.15

    def with_orchestration_effect(self, scale: float) -> SimModel:
        """This model with every logit that the team decides times ``scale``: what a node
        gains or loses from its place in the team (plan, search, context, self-revision,
        crowding, re-solve bonuses) and which role it has (each role's competence's distance
        from the family's mean competence).

        ``scale > 1`` makes orchestration decide more of an episode's outcome relative to the
        executor's noise (a larger Var_ρ(p | C), hence a higher tilt ceiling, docs/learning.md);
        1 is the default model, 0 makes the team's wiring irrelevant to a node's competence.
        """
        if scale < 0:
            raise ValueError(f"orchestration effect scale must be >= 0, got {scale}")
        if scale == 1.0:
            return self
        families = {
            name: replace(
                fam,
                competence=_spread(fam.competence, scale),
                plan_bonus=fam.plan_bonus * scale,
                search_bonus=fam.search_bonus * scale,
                context_bonus=fam.context_bonus * scale,
                self_revision=fam.self_revision * scale,
            )
            for name, fam in self.families.items()
        }
        return replace(
            self,
            families=MappingProxyType(families),
            crowding=self.crowding * scale,
            resolve_bonus=self.resolve_bonus * scale,
        )


def _spread(competence: Mapping[str, float], scale: float) -> Mapping[str, float]:
    """Role competences moved ``scale`` times as far from their family mean."""
    mean = sum(competence.values()) / len(competence)
    return _frozen({role: mean + scale * (c - mean) for role, c in competence.items()})


_QA_ADOPT = {"solver": 0.45, "verifier": 0.0, "researcher": 0.3, "finalizer": 0.9, "tool_user": 0.0}

DEFAULT_MODEL = SimModel(
    families=MappingProxyType(
        {
            "hotpotqa": FamilyModel(
                competence=_frozen(
                    {
                        "solver": -0.4,
                        "verifier": 0.1,
                        "researcher": -0.7,
                        "finalizer": -1.2,
                        "tool_user": -1.0,
                    }
                ),
                adopt=_frozen(_QA_ADOPT),
                plan_quality=0.7,
                plan_bonus=0.9,
                search_hit=0.5,
                tool_user_hit=0.2,
                search_bonus=1.2,
                detect=0.75,
                detect_trap=0.15,
                false_reject=0.1,
                self_revision=-1.5,
            ),
            "nq_open": FamilyModel(
                competence=_frozen(
                    {
                        "solver": 0.1,
                        "verifier": 0.0,
                        "researcher": -0.2,
                        "finalizer": -1.0,
                        "tool_user": -0.6,
                    }
                ),
                adopt=_frozen(_QA_ADOPT),
                plan_quality=0.4,
                plan_bonus=0.2,
                search_hit=0.65,
                tool_user_hit=0.4,
                search_bonus=1.4,
                detect=0.65,
                detect_trap=0.2,
                false_reject=0.1,
                self_revision=-0.2,
                out_tokens=0.6,
            ),
            "medqa": FamilyModel(
                competence=_frozen(
                    {
                        "solver": 0.15,
                        "verifier": 0.3,
                        "researcher": -0.2,
                        "finalizer": -0.9,
                        "tool_user": -0.9,
                    }
                ),
                adopt=_frozen(_QA_ADOPT),
                plan_quality=0.5,
                plan_bonus=0.4,
                search_hit=0.4,
                tool_user_hit=0.15,
                search_bonus=1.0,
                detect=0.65,
                detect_trap=0.2,
                false_reject=0.1,
                self_revision=-0.5,
            ),
            "aime": FamilyModel(
                competence=_frozen(
                    {
                        "solver": -0.45,
                        "verifier": -0.4,
                        "researcher": -1.2,
                        "finalizer": -1.3,
                        "tool_user": -1.0,
                    }
                ),
                adopt=_frozen(_QA_ADOPT),
                slope=3.0,
                plan_quality=0.6,
                plan_bonus=0.7,
                tool_user_hit=0.35,
                detect=0.35,
                detect_trap=0.15,
                false_reject=0.15,
                check_catches_trap=0.9,
                out_tokens=3.0,
            ),
            "mbpp_plus": FamilyModel(
                competence=_frozen(
                    {
                        "solver": 0.05,
                        "verifier": -0.1,
                        "researcher": -0.9,
                        "finalizer": -1.1,
                        "tool_user": -0.8,
                    }
                ),
                adopt=_frozen(_QA_ADOPT),
                plan_quality=0.6,
                plan_bonus=0.5,
                tool_user_hit=0.3,
                detect=0.35,
                detect_trap=0.1,
                false_reject=0.15,
                check_catches_trap=0.5,
                out_tokens=1.8,
            ),
            "alfworld": FamilyModel(
                competence=_frozen(
                    {
                        "solver": -1.3,
                        "verifier": -1.3,
                        "researcher": -1.6,
                        "finalizer": -1.7,
                    }
                ),
                adopt=_frozen({}),
                plan_quality=0.75,
                plan_bonus=0.8,
                slope=3.0,
                context_bonus=0.8,
                out_tokens=1.0,
            ),
        }
    )
)
