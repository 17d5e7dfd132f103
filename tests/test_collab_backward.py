"""b_φ (collabflow/backward.py): removable components, construction orders and log b, each
against a brute-force enumeration written here."""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch

from evosteer_core.collabflow.backward import (
    N_FEATURES,
    BackwardPolicy,
    component_features,
    order_count,
    unbuilding,
    uniform_log_prob,
)
from evosteer_core.collabflow.team import (
    BuildAction,
    IllegalBuildError,
    Team,
    apply,
    components,
    default_profiles,
    removable,
    team_spec,
)


def A(text: str) -> BuildAction:
    return BuildAction.parse(text)


TEAM_SPEC = team_spec(
    "hotpotqa", False, default_profiles(), skills=("s1", "s2"), max_skills_per_agent=2
)


def _team(*texts: str) -> Team:
    team = Team()
    for t in texts:
        team = apply(team, A(t), TEAM_SPEC)
    return team


TEAMS = [
    _team("add_agent(solver)", "set_output(single, solver)"),
    _team("add_agent(solver)", "add_agent(verifier)", "add_edge(solver, verifier, one_way)",
          "set_output(verifier, verifier)"),
    _team("add_agent(solver)", "add_agent(researcher)", "add_agent(verifier)",
          "add_edge(researcher, solver, interactive)", "add_edge(solver, verifier, one_way)",
          "add_edge(verifier, solver, final_only)", "bind_skill(solver, s1)", "set_output(integrator)"),
    _team("add_agent(tool_user)", "add_agent(finalizer)", "bind_skill(tool_user, s2)",
          "bind_skill(tool_user, s1)", "add_edge(tool_user, finalizer, one_way)",
          "set_output(formatter, finalizer)"),
]


def _needs(c: BuildAction) -> set[str]:
    """The agents a component refers to (the test's own reading of the canonical team)."""
    if c.kind == "add_edge":
        return {c.args[0], c.args[1]}
    if c.kind in ("bind_skill", "set_output"):
        return set(c.args[1:2] if c.kind == "set_output" else c.args[:1])
    return set()


def _closed(parts: set[BuildAction]) -> bool:
    agents = {c.args[0] for c in parts if c.kind == "add_agent"}
    return all(_needs(c) <= agents for c in parts)


@functools.cache
def _orders(team: Team) -> list[tuple[BuildAction, ...]]:
    """Every permutation of the components whose every prefix is a closed sub-team."""
    comps = components(team)
    return [
        p for p in itertools.permutations(comps)
        if all(_closed(set(p[:i])) for i in range(1, len(p) + 1))
    ]


@pytest.mark.parametrize("team", TEAMS)
def test_removable_components_are_those_whose_removal_leaves_a_closed_team(team):
    comps = set(components(team))
    brute = {c for c in comps if _closed(comps - {c})}
    assert set(removable(team)) == brute
    # ... and exactly the components some construction order adds last
    assert brute == {order[-1] for order in _orders(team)}


@pytest.mark.parametrize("team", TEAMS)
def test_order_count_is_the_number_of_construction_orders(team):
    orders = _orders(team)
    assert order_count(team) == len(orders)
    # the uniform ablation gives every order 1/|O(G)|: its total over O(G) is one
    assert sum(math.exp(uniform_log_prob(team)) for _ in orders) == pytest.approx(1.0)


@pytest.mark.parametrize("team", TEAMS[1:])
def test_unbuilding_follows_an_order_backwards_and_refuses_non_orders(team):
    orders = _orders(team)
    for order in orders[:20]:
        features, choices = unbuilding(team, order)
        assert len(features) == len(choices) == team.size()
        assert all(len(row) == N_FEATURES for step in features for row in step)
    comps = components(team)
    bad = next(p for p in itertools.permutations(comps) if p not in set(orders))
    with pytest.raises(IllegalBuildError, match="cannot be the last addition"):
        unbuilding(team, bad)


def test_component_features_closed_form():
    team = TEAMS[2]
    edge = A("add_edge(solver, verifier, one_way)")
    x = component_features(edge, team, full_size=16)
    assert x == [0, 1, 0, 0] + [0, 1, 0] + [0, 0, 0, 0] + [1, team.size() / 16]
    out = component_features(A("set_output(integrator)"), team, full_size=team.size())
    assert out == [0, 0, 0, 1] + [0, 0, 0] + [0, 1, 0, 0] + [0, 1.0]


def _brute_log_b(policy: BackwardPolicy, team: Team, order) -> float:
    """Σ_s log softmax over the removable set, one component at a time (plain floats)."""
    total, current, full = 0.0, team, team.size()
    for action in reversed(order):
        options = [c for c in components(current) if _closed(set(components(current)) - {c})]
        scores = []
        for c in options:
            x = torch.tensor(component_features(c, current, full), dtype=torch.float64)
            with torch.no_grad():
                scores.append(float(policy.out(torch.tanh(policy.hidden(x)))))
        m = max(scores)
        lse = m + math.log(sum(math.exp(s - m) for s in scores))
        total += scores[options.index(action)] - lse
        current = _rebuild(set(components(current)) - {action})
    return total


def _rebuild(parts: set[BuildAction]) -> Team:
    team = Team()
    for c in sorted(parts, key=lambda c: c.kind != "add_agent"):
        team = apply(team, c, TEAM_SPEC)
    return team


def _random_policy(seed: int) -> BackwardPolicy:
    torch.manual_seed(seed)
    policy = BackwardPolicy().double()
    with torch.no_grad():
        for p in policy.parameters():
            p.normal_(0.0, 0.8)
    return policy


def _log_b(policy: BackwardPolicy, team: Team, orders) -> torch.Tensor:
    """log b_φ of many orders of one team through the padded forward pass."""
    rows = [unbuilding(team, o) for o in orders]
    n_k = max(len(step) for f, _ in rows for step in f)
    feats = torch.zeros(len(rows), team.size(), n_k, N_FEATURES, dtype=torch.float64)
    mask = torch.zeros(len(rows), team.size(), n_k, dtype=torch.bool)
    for b, (f, _) in enumerate(rows):
        for s, step in enumerate(f):
            feats[b, s, : len(step)] = torch.tensor(step, dtype=torch.float64)
            mask[b, s, : len(step)] = True
    choice = torch.tensor([c for _, c in rows])
    return policy(feats, mask, choice)


@pytest.mark.parametrize("team", TEAMS[1:])
def test_learned_log_b_matches_brute_force_and_sums_to_one_over_orders(team):
    policy = _random_policy(3)
    orders = _orders(team)
    with torch.no_grad():
        log_b = _log_b(policy, team, orders)
    for order, value in list(zip(orders, log_b.tolist(), strict=True))[:12]:
        assert value == pytest.approx(_brute_log_b(policy, team, order), abs=1e-10)
    assert float(log_b.exp().sum()) == pytest.approx(1.0, abs=1e-12)
    assert len(set(round(v, 9) for v in log_b.tolist())) > 1  # not uniform over orders


def test_untrained_b_is_uniform_per_step_and_the_product_sums_to_one():
    team, policy = TEAMS[2], BackwardPolicy().double()
    orders = _orders(team)
    with torch.no_grad():
        log_b = _log_b(policy, team, orders)
    for order, value in zip(orders[:10], log_b.tolist(), strict=False):
        # Π_s 1/|O(G_s)| with the removable sets counted by the closure rule
        expected, parts = 0.0, set(components(team))
        for action in reversed(order):
            expected -= math.log(sum(_closed(parts - {c}) for c in parts))
            parts = parts - {action}
        assert value == pytest.approx(expected, abs=1e-12)
    assert float(log_b.exp().sum()) == pytest.approx(1.0, abs=1e-12)
