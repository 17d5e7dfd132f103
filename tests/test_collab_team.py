"""CollabFlow teams: legality, canonical hash, and removals that invert construction."""

from __future__ import annotations

import itertools

import pytest

from evosteer_core.collabflow.team import (
    STOP,
    BuildAction,
    IllegalBuildError,
    Team,
    apply,
    decode,
    default_profiles,
    is_complete,
    legal_actions,
    removable,
    remove,
    team_spec,
)


def _spec(family: str = "hotpotqa", **kw):
    interactive = family == "alfworld"
    return team_spec(family, interactive, default_profiles(), **kw)


def A(text: str) -> BuildAction:
    return BuildAction.parse(text)


def test_text_round_trips_and_bad_text_is_named():
    for t in ["add_agent(solver)", "add_edge(a, b, one_way)", "set_output(integrator)", "stop"]:
        assert A(t).text() == t
    with pytest.raises(ValueError, match="not a construction action"):
        A("add agent solver")
    with pytest.raises(ValueError, match="takes"):
        BuildAction("add_edge", ("a", "b"))


def test_canonical_hash_ignores_order_and_keeps_protocols_distinct():
    spec = _spec()
    h1 = ["add_agent(solver)", "add_agent(verifier)", "add_edge(solver, verifier, one_way)",
          "set_output(verifier, verifier)", "stop"]
    h2 = ["add_agent(verifier)", "add_agent(solver)", "set_output(verifier, verifier)",
          "add_edge(solver, verifier, one_way)", "stop"]
    t1, t2 = decode([A(x) for x in h1], spec), decode([A(x) for x in h2], spec)
    assert t1 == t2 and t1.team_hash() == t2.team_hash()
    h3 = [x.replace("one_way", "interactive") for x in h1]
    assert decode([A(x) for x in h3], spec).team_hash() != t1.team_hash()


def test_stop_needs_a_complete_team_and_each_profile_once():
    spec = _spec()
    team = apply(Team(), A("add_agent(solver)"), spec)
    assert STOP not in legal_actions(team, spec)
    with pytest.raises(IllegalBuildError, match="output rule is not set"):
        apply(team, STOP, spec)
    with pytest.raises(IllegalBuildError, match="at most once"):
        apply(team, A("add_agent(solver)"), spec)
    team = apply(team, A("set_output(single, solver)"), spec)
    assert STOP in legal_actions(team, spec) and is_complete(team, spec)
    with pytest.raises(IllegalBuildError, match="already set"):
        apply(team, A("set_output(integrator)"), spec)


def test_stateful_team_has_one_writer_and_only_advisor_to_executor_edges():
    spec = _spec("alfworld")
    assert {p.profile_id for p in spec.profiles} == {"actor", "planner", "checker"}
    team = apply(Team(), A("add_agent(planner)"), spec)
    assert STOP not in legal_actions(team, spec)
    team = apply(team, A("add_agent(actor)"), spec)
    edges = [a for a in legal_actions(team, spec) if a.kind == "add_edge"]
    assert [a.text() for a in edges] == ["add_edge(planner, actor, one_way)"]
    outs = [a.text() for a in legal_actions(team, spec) if a.kind == "set_output"]
    assert outs == ["set_output(single, actor)"]


def _last_additions(spec, depth):
    """Brute force: every partial team reachable in ≤ depth legal actions, each with the set of
    actions that can have built it last (from any reachable predecessor)."""
    last: dict[Team, set[BuildAction]] = {Team(): set()}
    frontier = {Team()}
    for _ in range(depth):
        nxt = set()
        for prev in frontier:
            for a in legal_actions(prev, spec):
                if a != STOP:
                    child = apply(prev, a, spec)
                    last.setdefault(child, set()).add(a)
                    nxt.add(child)
        frontier = nxt
    return last


def test_removals_are_exactly_the_legal_last_additions():
    """For every reachable team, c ∈ O(G) iff G − c is reachable and adding c there is legal."""
    spec = _spec("hotpotqa", max_agents=2, max_edges=2, skills=("s1",))
    last = _last_additions(spec, 5)
    assert len(last) > 100
    for team, adds in last.items():
        assert set(removable(team)) == adds, team
        for a in removable(team):
            assert apply(remove(team, a), a, spec) == team


def test_orders_to_a_team_are_its_linear_extensions():
    """A 2-agent team with an edge and an output: the orders construction allows are the
    permutations of its 4 components with the edge after both agents and the output after its
    agent — (2 orders of s, r, e) × (3 or 2 slots for o after s) = 5."""
    spec = _spec()
    target = decode([A(x) for x in ["add_agent(solver)", "add_agent(researcher)",
                                     "add_edge(researcher, solver, one_way)",
                                     "set_output(single, solver)", "stop"]], spec)
    comps = [a for a in removable(target)] + [A("add_agent(researcher)")]
    comps = sorted(set(comps) | {A("add_agent(solver)")}, key=lambda a: a.text())
    n = 0
    for order in itertools.permutations(comps):
        try:
            if decode([*order, STOP], spec) == target:
                n += 1
        except IllegalBuildError:
            pass
    assert n == 5
