"""The orchestrator's own decisions in a rollout: charged before their action runs, forced
decisions free, a decision the budget cannot cover finalized, and the per-decision deadline
(docs/method.md §1.3, 5 s) enforced as a charged, recorded timeout."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
import torch

from evosteer_core.episode import rollout
from evosteer_core.episode.actions import Action
from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.episode.rollout import EpisodePlan, RolloutContext, collect_rollouts
from evosteer_core.episode.runtime import Episode
from evosteer_core.infra.config import load_config
from evosteer_core.policy.orchestrator import Choice
from evosteer_core.sim.executor import SimExecutor
from evosteer_core.sim.suite import make_sim_record
from evosteer_core.training.heads import ValueHead

CAT = default_catalogue()
RECORD = make_sim_record("aime", 3, 0, "train")


class ScriptedPolicy:
    """Picks the first legal action of the kind listed for each decision index (else the
    first legal action); every prompt counts ``prompt_tokens``; each sample takes ``sleep_s``."""

    max_action_tokens = 8

    def __init__(self, script: Sequence[str], prompt_tokens: int = 40, sleep_s: float = 0.0):
        self.script, self.prompt_tokens, self.sleep_s = list(script), prompt_tokens, sleep_s
        self.sampled = 0

    def count_tokens(self, prompt: str) -> int:
        return self.prompt_tokens

    def sample(
        self,
        prompts: Sequence[str],
        legal: Sequence[Sequence[str]],
        generators: Sequence[torch.Generator],
        use_adapter: bool,
        temperature: float = 1.0,
        encode: bool = False,
    ) -> list[Choice]:
        time.sleep(self.sleep_s)
        out = []
        for acts in legal:
            want = self.script[min(self.sampled, len(self.script) - 1)]
            self.sampled += 1
            index = next((i for i, a in enumerate(acts) if want in a), 0)
            out.append(Choice(index, -0.5, self.prompt_tokens, 5, [1.0] * 4 if encode else None))
        return out


@pytest.fixture
def episodes(monkeypatch: pytest.MonkeyPatch) -> list[Episode]:
    """Every Episode the rollout creates (to read their ledgers)."""
    made: list[Episode] = []

    class Recording(Episode):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(rollout, "Episode", Recording)
    return made


def context(limits: BudgetLimits, **kw) -> RolloutContext:
    return RolloutContext(
        catalogue=CAT,
        limits=limits,
        executor=SimExecutor(),
        evaluator=lambda task, text, env: 0.0,
        menus={},
        value_head=ValueHead(seed=0),
        run_seed=3,
        step=0,
        **kw,
    )


def node_tokens(ep: Episode) -> int:
    return sum(o.result.tokens_in + o.result.tokens_out for o in ep.history if o.result)


def test_a_decision_past_its_deadline_is_charged_and_replaced_by_the_finalizing_action(
    episodes: list[Episode],
) -> None:
    seconds = iter([0.5, 6.0])
    clock = lambda prompt, action: next(seconds)  # noqa: E731
    policy = ScriptedPolicy(['"role_id":"solver"', '"role_id":"verifier"'])
    traj, dec = collect_rollouts(
        policy, [EpisodePlan(RECORD, "theta", 0)], context(BudgetLimits(), decision_clock=clock)
    )
    (ep,) = episodes
    assert [o.action for o in ep.history] == [
        Action("ADD_AGENT", node_id="n0", role_id="solver"),
        Action("SET_OUTPUT", node_id="n0"),  # not the sampled ADD_AGENT verifier
        Action("STOP"),
    ]
    assert traj["decision_timeouts"].tolist() == [1]
    late = dec.iloc[1]
    assert late["forced"] and late["legal"] == ['{"kind":"SET_OUTPUT","node_id":"n0"}']
    assert (late["chosen"], late["logp_sample"]) == (0, 0.0)
    assert len(dec.iloc[0]["legal"]) > 1 and not dec.iloc[0]["forced"]
    # both sampled decisions are charged (tokens and time), the forced STOP is free
    assert ep.ledger.tokens == node_tokens(ep) + 2 * (40 + 5)
    assert ep.ledger.wall_s == pytest.approx(0.5 + 6.0 + ep.history[0].result.latency_s)
    assert "deadline" in ep.finalizing


def test_the_measured_clock_enforces_the_deadline(episodes: list[Episode]) -> None:
    policy = ScriptedPolicy(['"role_id":"solver"'], sleep_s=0.3)
    traj, dec = collect_rollouts(
        policy,
        [EpisodePlan(RECORD, "rho", 0)],
        context(BudgetLimits(decision_deadline_s=0.1)),
    )
    (ep,) = episodes
    assert [o.action for o in ep.history] == [Action("STOP")]  # no node yet: STOP unanswered
    assert traj["decision_timeouts"].tolist() == [1] and traj["reward"].tolist() == [0.0]
    assert ep.ledger.wall_s >= 0.3 and ep.ledger.tokens == 40 + 5


def test_forced_decisions_make_no_model_call_and_cost_nothing(episodes: list[Episode]) -> None:
    plan = EpisodePlan(RECORD, "pair_control", 0, pair_skill="evosteer-x", pair_kind="candidate")
    policy = ScriptedPolicy(["SET_OUTPUT", "STOP"])
    traj, dec = collect_rollouts(policy, [plan], context(BudgetLimits()))
    (ep,) = episodes
    assert dec["forced"].tolist() == [True, False, False]
    assert ep.ledger.tokens == node_tokens(ep) + 2 * (40 + 5)
    assert traj["tokens"].tolist() == [ep.ledger.tokens]
    assert traj["decision_timeouts"].tolist() == [0]


def test_a_decision_the_budget_cannot_cover_is_finalized_for_free(
    episodes: list[Episode],
) -> None:
    limits = BudgetLimits(total_tokens=12_288, token_scale=0.01)
    policy = ScriptedPolicy(['"role_id":"solver"', '"role_id":"verifier"'], prompt_tokens=8_000)
    traj, dec = collect_rollouts(policy, [EpisodePlan(RECORD, "theta", 0)], context(limits))
    (ep,) = episodes
    assert ep.ledger.tokens <= 12_288 and ep.ledger.tokens_over == 0
    assert ep.ledger.tokens == node_tokens(ep) + 8_000 + 5
    assert [o.action.kind for o in ep.history] == ["ADD_AGENT", "SET_OUTPUT", "STOP"]
    assert dec["forced"].tolist() == [False, True, True]
    assert traj["decision_timeouts"].tolist() == [0]
    assert "cannot cover" in ep.finalizing


def test_tiny_sim_decisions_are_deterministic_and_never_reach_the_deadline() -> None:
    """The sim charges a simulated decision time (a function of the token counts, no clock):
    even the longest tiny-sim decision (full context, longest action) is under 5 s."""
    cfg = load_config(None)
    ex = SimExecutor()
    longest = ex.decision_seconds(cfg.policy.context_tokens, cfg.policy.max_action_tokens)
    assert longest == ex.decision_seconds(cfg.policy.context_tokens, cfg.policy.max_action_tokens)
    assert 0.0 < longest < cfg.budget.decision_deadline_s
