"""The Collab-Director (docs/collabflow.md §1): its prompt, legal-set sampling against a
brute-force computation, and the construction episode's separate budget."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_support import perturb_adapter

from evosteer_core.collabflow.construction import (
    ConstructionBudget,
    ConstructionLedger,
    construct,
    construction_budget,
    execution_limits,
)
from evosteer_core.collabflow.director import (
    DirectorView,
    director_prompt,
    legal_logprobs,
    sample_index,
    scoring_tokens,
)
from evosteer_core.collabflow.team import (
    STOP,
    BuildAction,
    Team,
    apply,
    candidate_actions,
    decode,
    default_profiles,
    legal_actions,
    team_spec,
)
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.infra.config import LoraConfig, PolicyConfig, config_from_dict, load_config
from evosteer_core.infra.seeding import torch_generator
from evosteer_core.policy.backbone import Policy, load_policy
from evosteer_core.sim.suite import make_sim_suite

CATALOGUE = default_catalogue()
RECORDS = make_sim_suite(1, 0, "train")
"""One simulated record per family."""
WIDE = ConstructionBudget(tokens=10**7, deadline_s=1e6, wall_s=1e6)


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Policy:
    """The tiny backbone with a non-zero adapter, so θ and ρ differ."""
    out = load_policy(
        PolicyConfig(lora=LoraConfig(r=8, alpha=16)),
        cache_dir=str(tmp_path_factory.mktemp("director-cache")),
        reuse=False,
    )
    return perturb_adapter(out, 11)


def _spec(family: str):
    return team_spec(family, CATALOGUE.family(family).interactive, default_profiles())


def _record(family: str):
    return next(r for r in RECORDS if r.family == family)


def _prefix(family: str, actions: list[str]) -> Team:
    spec, team = _spec(family), Team()
    for a in actions:
        team = apply(team, BuildAction.parse(a), spec)
    return team


def _state(family: str, actions: list[str]) -> tuple[str, tuple[str, ...]]:
    """(prompt, legal strings) of the state reached by ``actions`` on ``family``'s record."""
    spec, team = _spec(family), _prefix(family, actions)
    view = DirectorView(
        family,
        _record(family).orchestrator_text,
        spec,
        team,
        tuple(BuildAction.parse(a) for a in actions),
        4096,
    )
    prompt = director_prompt(view, CATALOGUE)
    return prompt, tuple(a.text() for a in legal_actions(team, spec))


def _brute_force(policy: Policy, prompt: str, legal: tuple[str, ...], adapter: bool) -> list[float]:
    """π̄ computed string by string: the peft model's own forward on each whole unpadded
    sequence, a full-vocabulary log-softmax at each action position, summed, then a softmax
    over the legal strings (float64)."""
    tok = policy.tokenizer
    prompt_ids = tok.encode_prompt(prompt)
    sums = []
    for text in legal:
        action = list(tok.encode_action(text))
        ids = torch.tensor([prompt_ids + action])
        with torch.no_grad(), policy.adapter_context(adapter):
            logits = policy.model(input_ids=ids).logits[0].double()
        total = 0.0
        for j, token in enumerate(action):
            total += float(torch.log_softmax(logits[len(prompt_ids) - 1 + j], 0)[token])
        sums.append(total)
    top = max(sums)
    z = sum(math.exp(s - top) for s in sums)
    return [math.exp(s - top) / z for s in sums]


STATES = [
    ("hotpotqa", []),
    ("hotpotqa", ["add_agent(researcher)", "add_agent(solver)"]),
    (
        "mbpp_plus",
        ["add_agent(solver)", "add_agent(verifier)", "add_edge(solver, verifier, one_way)"],
    ),
    ("alfworld", ["add_agent(actor)", "add_agent(planner)"]),
]


@pytest.mark.parametrize(("family", "actions"), STATES)
@pytest.mark.parametrize("adapter", [True, False])
def test_legal_set_distribution_equals_the_brute_force_computation(
    policy: Policy, family: str, actions: list[str], adapter: bool
) -> None:
    prompt, legal = _state(family, actions)
    assert len(legal) > 1
    got = legal_logprobs(policy, prompt, legal, use_adapter=adapter).double().exp().tolist()
    want = _brute_force(policy, prompt, legal, adapter)
    assert got == pytest.approx(want, abs=2e-5)
    assert sum(got) == pytest.approx(1.0, abs=1e-6)


def test_theta_and_rho_differ_with_a_nonzero_adapter(policy: Policy) -> None:
    prompt, legal = _state(*STATES[1])
    theta = legal_logprobs(policy, prompt, legal, use_adapter=True)
    rho = legal_logprobs(policy, prompt, legal, use_adapter=False)
    assert not torch.allclose(theta, rho, atol=1e-4)


def test_gradients_flow_into_the_adapter_only_when_asked(policy: Policy) -> None:
    prompt, legal = _state(*STATES[1])
    assert not legal_logprobs(policy, prompt, legal, use_adapter=True).requires_grad
    lp = legal_logprobs(policy, prompt, legal, use_adapter=True, requires_grad=True)
    lp[0].backward()
    grads = [p.grad for p in policy.lora_parameters()]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    for p in policy.lora_parameters():
        p.grad = None


def test_samples_are_legal_and_follow_the_renormalized_distribution(policy: Policy) -> None:
    """Mass 0 outside the legal set: every draw is a legal index, and the draws' frequencies
    match π̄ (a 5-sigma band per action over 3000 draws)."""
    family, actions = STATES[1]
    prompt, legal = _state(family, actions)
    spec, team = _spec(family), _prefix(family, actions)
    illegal = {a.text() for a in candidate_actions(team, spec)} - set(legal)
    assert illegal  # the registry has actions the legal set leaves out
    logp = legal_logprobs(policy, prompt, legal, use_adapter=True)
    gen = torch_generator("test-director", "draws")
    n = 3000
    counts = Counter(sample_index(logp, gen) for _ in range(n))
    assert set(counts) <= set(range(len(legal)))
    for i, p in enumerate(logp.double().exp().tolist()):
        assert abs(counts[i] / n - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-9


def test_prompt_shows_the_task_but_no_record_id_split_or_answer() -> None:
    rec = _record("hotpotqa")
    prompt, _ = _state("hotpotqa", ["add_agent(solver)"])
    assert rec.record_id not in prompt and "train" not in prompt and "#0" not in prompt
    assert all(a.lower() not in prompt.lower() for a in rec.answers)
    assert rec.orchestrator_text[:30] in prompt
    for line in ("family hotpotqa", "protocols final_only one_way interactive", "agents solver"):
        assert line in prompt
    assert "profile researcher role=researcher mode=stateless tools=search out=single" in prompt
    assert "history add_agent(solver)" in prompt and "budget 4096" in prompt


@pytest.mark.parametrize("family", ["hotpotqa", "alfworld"])
def test_construction_is_seed_deterministic_and_builds_a_legal_team(
    policy: Policy, family: str
) -> None:
    spec = _spec(family)
    a, b = _run(policy, family, 1), _run(policy, family, 1)
    assert a == b and not a.aborted
    assert decode(list(a.actions), spec) == a.team and a.actions[-1] == STOP
    assert a.tokens == sum(s.tokens for s in a.steps)
    for s in a.steps:
        assert math.fsum(math.exp(x) for x in s.legal_logp) == pytest.approx(1.0, abs=1e-6)
        assert s.logp == s.legal_logp[s.index]


def _run(policy: Policy, family: str, seed: int, use_adapter: bool = True):
    return construct(
        policy,
        _spec(family),
        CATALOGUE,
        _record(family).orchestrator_text,
        WIDE,
        use_adapter=use_adapter,
        seed_parts=(seed, family),
        decision_clock=lambda tokens_in, tokens_out: tokens_in / 5000,
    )


def test_the_seed_matters(policy: Policy) -> None:
    histories = {_run(policy, "hotpotqa", seed, use_adapter=False).actions for seed in range(4)}
    assert len(histories) > 1


def _next_cost(policy: Policy, spec, task: str, actions, left: int) -> int:
    """The tokens of the decision a construction would take next (independently rebuilt)."""
    team = Team()
    for a in actions:
        team = apply(team, a, spec)
    legal = [a.text() for a in legal_actions(team, spec)]
    view = DirectorView(spec.family, task, spec, team, tuple(actions), left)
    return scoring_tokens(policy, director_prompt(view, CATALOGUE), legal) if len(legal) > 1 else 0


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(b_con=st.integers(0, 2500), seed=st.integers(0, 3))
def test_construction_never_spends_past_b_con_and_aborts_exactly_at_overflow(
    policy: Policy, b_con: int, seed: int
) -> None:
    spec, task = _spec("medqa"), _record("medqa").orchestrator_text
    budget = replace(WIDE, tokens=b_con)
    c = construct(policy, spec, CATALOGUE, task, budget, use_adapter=True, seed_parts=(seed,))
    assert c.tokens == sum(s.tokens for s in c.steps) <= b_con
    if c.aborted:
        assert "B_con left" in c.abort_reason
        left = b_con - c.tokens
        assert _next_cost(policy, spec, task, c.actions, left) > left
    else:
        assert c.actions[-1] == STOP


def test_a_decision_past_its_deadline_or_the_wall_aborts(policy: Policy) -> None:
    spec, task = _spec("aime"), _record("aime").orchestrator_text
    slow = construct(
        policy,
        spec,
        CATALOGUE,
        task,
        replace(WIDE, deadline_s=1.0),
        use_adapter=True,
        seed_parts=(0,),
        decision_clock=lambda tokens_in, tokens_out: 2.0,
    )
    assert slow.aborted and "past its 1 s" in slow.abort_reason and not slow.steps
    walled = construct(
        policy,
        spec,
        CATALOGUE,
        task,
        replace(WIDE, wall_s=2.5),
        use_adapter=True,
        seed_parts=(0,),
        decision_clock=lambda tokens_in, tokens_out: 1.0,
    )
    assert walled.aborted and "past 2.5 s" in walled.abort_reason and len(walled.steps) == 2


@settings(max_examples=200, deadline=None)
@given(
    b_total=st.integers(2, 10**6), frac=st.floats(0.0, 1.0), charges=st.lists(st.integers(0, 5000))
)
def test_budget_split_never_borrows(b_total: int, frac: float, charges: list[int]) -> None:
    """B_con + B_exec = B_total; the construction ledger takes a charge only while it fits in
    B_con and leaves the execution limits as they were."""
    b_con = min(b_total - 1, max(1, int(frac * b_total)))
    cfg = config_from_dict(
        {
            "name": "split",
            "store": {"root": "/tmp/unused"},
            "method": "collabflow",
            "budget": {"total_tokens": b_total},
            "collabflow": {"construction_tokens": b_con},
        }
    )
    exec_before = execution_limits(cfg)
    assert exec_before.total_tokens + construction_budget(cfg).tokens == b_total
    ledger = ConstructionLedger(construction_budget(cfg))
    for charge in charges:
        fits = ledger.tokens + charge <= b_con
        assert ledger.affords(charge) == fits
        if fits:
            ledger.charge(charge, 0.0)
        else:
            with pytest.raises(ValueError):
                ledger.charge(charge, 0.0)
        assert 0 <= ledger.tokens <= b_con
    assert execution_limits(cfg) == exec_before


def test_collabflow_config_needs_an_execution_budget() -> None:
    cfg = load_config("configs/tiny-sim.yaml")
    with pytest.raises(ValueError, match="no execution budget"):
        config_from_dict(
            {
                **cfg.to_dict(),
                "method": "collabflow",
                "collabflow": {"construction_tokens": cfg.budget.total_tokens},
            }
        )
