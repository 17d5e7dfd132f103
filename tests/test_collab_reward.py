"""The team reward R̃ (collabflow/reward.py): the counters' freeze/increment rule, closed-form
values, the MDL prior against an independent count over every team of a small spec, and the
counters' deterministic JSON."""

from __future__ import annotations

import json
import math

import pytest

from evosteer_core.collabflow.reward import (
    CounterSnapshot,
    Outcome,
    ReliabilityCounters,
    is_success,
    outcome_id,
    relative_code_length,
    team_reward,
)
from evosteer_core.collabflow.team import (
    STOP,
    BuildAction,
    Team,
    TeamEdge,
    apply,
    default_profiles,
    is_complete,
    legal_actions,
    team_spec,
)


def _spec(**kw):
    return team_spec("hotpotqa", False, default_profiles(), **kw)


def _team(spec, *texts):
    team = Team()
    for t in texts:
        team = apply(team, BuildAction.parse(t), spec)
    return team


SOLO = ("add_agent(solver)", "set_output(single, solver)")


def test_rewards_of_a_batch_read_the_frozen_counters_and_duplicates_count_once():
    spec = _spec()
    team = _team(spec, *SOLO)
    h = team.team_hash()
    counters = ReliabilityCounters()
    counters.update([Outcome("old-1", h, "hotpotqa", True)])  # s, n = 1, 1
    frozen = counters.snapshot()
    batch = [
        # (execution id, r_ans): the second row is a copy of the first execution's record
        (outcome_id("rec-1", h, "seed-a"), 1.0),
        (outcome_id("rec-1", h, "seed-a"), 1.0),
        (outcome_id("rec-2", h, "seed-b"), 0.0),
        (outcome_id("rec-3", h, "seed-c"), 1.0),
    ]
    rewards = [team_reward(r, team, spec, "hotpotqa", frozen, eps_min=0.01) for _, r in batch]
    counters.update(Outcome(i, h, "hotpotqa", is_success(r)) for i, r in batch)
    # every reward of the batch used s = 1, n = 1: (1.5)/(2) = 0.75
    assert rewards == [pytest.approx(0.01 + 0.75), pytest.approx(0.01 + 0.75), 0.01,
                       pytest.approx(0.01 + 0.75)]
    assert frozen.posterior(h, "hotpotqa") == 0.75  # the snapshot did not move
    # three unique outcomes, two successes: s, n = 3, 4
    assert counters.counts == {f"hotpotqa|{h}": (3, 4)}
    assert counters.snapshot().posterior(h, "hotpotqa") == pytest.approx(3.5 / 5)
    # a record copied into a later round is still counted once
    assert counters.update([Outcome(batch[0][0], h, "hotpotqa", True)]) == 0
    assert counters.counts[f"hotpotqa|{h}"] == (3, 4)
    # clusters are separate counters
    assert counters.snapshot().posterior(h, "aime") == 0.5


def test_team_reward_closed_form():
    spec = _spec()
    team = _team(spec, "add_agent(solver)", "add_agent(verifier)",
                 "add_edge(solver, verifier, interactive)", "set_output(verifier, verifier)")
    snap = CounterSnapshot({f"medqa|{team.team_hash()}": (2, 3)})
    # one edge among 3 protocols: L_rel = log 3; posterior (2 + 1/2)/(3 + 1) = 0.625
    r = team_reward(0.8, team, spec, "medqa", snap, eps_min=0.001)
    assert r == pytest.approx(0.001 + 0.8 * 0.625 / 3)
    # λ = 0 switches the structural prior off
    assert team_reward(0.8, team, spec, "medqa", snap, eps_min=0.001, mdl_lambda=0.0) == (
        pytest.approx(0.001 + 0.8 * 0.625)
    )
    assert team_reward(0.0, team, spec, "medqa", snap, eps_min=0.001) == 0.001
    with pytest.raises(ValueError, match=r"r_ans must be in \[0, 1\]"):
        team_reward(1.5, team, spec, "medqa", snap, eps_min=0.001)


def _all_complete_teams(spec) -> set[Team]:
    """Every complete team of ``spec`` (search over teams, not histories)."""
    seen, frontier = {Team()}, [Team()]
    while frontier:
        team = frontier.pop()
        for a in legal_actions(team, spec):
            if a != STOP:
                nxt = apply(team, a, spec)
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
    return {t for t in seen if is_complete(t, spec)}


def _code_length(team: Team, teams: set[Team]) -> float:
    """The code of docs/collabflow.md §3 counted on the enumerated teams: a fair bit per
    ordered pair of agents, then each edge's protocol among the protocols that give a team of
    the space, each binding's skill among the skills that do."""
    n = len(team.agents)
    total = n * (n - 1) * math.log(2)
    for e in team.edges:
        others = {TeamEdge(e.source, e.target, p) for p in ("final_only", "one_way", "interactive")}
        options = sum(
            type(team)(team.agents, (team.edges - {e}) | {o}, team.bindings, team.output) in teams
            for o in others
        )
        total += math.log(options)
    for b in team.bindings:
        options = sum(
            type(team)(team.agents, team.edges, (team.bindings - {b}) | {(b[0], k)}, team.output)
            in teams
            for k in ("s1", "s2", "s3")
        )
        total += math.log(options)
    return total


def test_mdl_prior_is_the_code_length_above_the_shortest_team_of_its_class():
    spec = team_spec(
        "hotpotqa", False, default_profiles()[:2], skills=("s1", "s2"), max_edges=2,
        output_modes=("single", "integrator"),
    )
    teams = _all_complete_teams(spec)
    assert len(teams) > 100
    lengths = {t: _code_length(t, teams) for t in teams}
    for team in teams:
        cls = [t for t in teams if t.agents == team.agents and t.output == team.output]
        expected = lengths[team] - min(lengths[t] for t in cls)
        assert relative_code_length(team, spec) == pytest.approx(expected, abs=1e-12)
        assert relative_code_length(team, spec) >= 0


def test_counters_json_is_deterministic_and_round_trips():
    a, b = ReliabilityCounters(), ReliabilityCounters()
    outs = [Outcome(f"x{i}", f"h{i % 3}", "aime", i % 2 == 0) for i in range(7)]
    a.update(outs)
    b.update(reversed(outs))
    assert a.to_json() == b.to_json()
    again = ReliabilityCounters.from_dict(json.loads(a.to_json()))
    assert again == a and again.to_json() == a.to_json()
    with pytest.raises(ValueError, match=r"entry 'aime\|h0' needs 0 <= s <= n"):
        ReliabilityCounters.from_dict({"counts": {"aime|h0": [3, 2]}})
    with pytest.raises(ValueError, match="task cluster 'chess'"):
        a.update([Outcome("y", "h", "chess", True)])
