"""CollabFlow communication: the fixed sweep order, the protocols' edge programs (every
protocol × every gate branch), cyclic sweeps, budget stops and the gate log's rates
(docs/collabflow.md §2)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from evosteer_core.collabflow.communication import (
    BudgetExhausted,
    agent_order,
    communicate,
    edge_order,
    gate_summary,
    is_cyclic,
)
from evosteer_core.collabflow.evidence import Candidate, EvidenceRecord, Holding
from evosteer_core.collabflow.team import Team, TeamEdge
from evosteer_core.executors.base import Evidence


def team(*edges: tuple[str, str, str], agents: str = "") -> Team:
    names = set(agents) | {x for e in edges for x in e[:2]}
    return Team(agents=frozenset(names), edges=frozenset(TeamEdge(*e) for e in edges))


def held(agent: str, answer: str | None, level: int = 0, version: str | None = None) -> Holding:
    v = version or f"{agent}#0"
    c = Candidate(v, agent, answer, f"Answer: {answer}")
    kinds = {0: (), 1: ("retrieval",), 2: ("exec_check",)}[level]
    return Holding.of(c, [EvidenceRecord(f"{v}-{k}", v, 0, agent, Evidence(k, True)) for k in kinds])


GOLD = "g"


def correct(c: Candidate) -> bool:
    return c.answer == GOLD


class Reviser:
    """Scripted revisions: each call returns the next answer (None: the call failed)."""

    def __init__(self, *answers: str | None, budget: int | None = None) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, str | None, str | None, str]] = []
        self.budget = budget

    def __call__(self, agent, receiver, sender, protocol):
        if self.budget is not None and len(self.calls) >= self.budget:
            raise BudgetExhausted("no tokens left")
        self.calls.append((agent, receiver.candidate.answer, sender.candidate.answer, protocol))
        answer = self.answers.pop(0)
        if answer is None:
            return None
        return held(agent, answer, version=f"{agent}#{len(self.calls)}")


# ---------------------------------------------------------------------------- sweep order
def brute_force_order(t: Team) -> list[str]:
    """The lexicographically smallest topological order, by enumeration (acyclic teams)."""
    for perm in itertools.permutations(sorted(t.agents)):
        pos = {a: i for i, a in enumerate(perm)}
        if all(pos[e.source] < pos[e.target] for e in t.edges):
            return list(perm)
    raise AssertionError("cyclic")


def test_agent_order_is_the_smallest_topological_order_on_random_dags():
    rng = random.Random(3)
    for _ in range(200):
        names = rng.sample("abcdef", rng.randint(1, 5))
        rank = {a: i for i, a in enumerate(names)}  # a hidden order makes every edge forward
        edges = [(a, b, "one_way") for a in names for b in names if rank[a] < rank[b] and rng.random() < 0.4]
        t = team(*edges, agents="".join(names))
        assert not is_cyclic(t)
        assert agent_order(t) == brute_force_order(t)


def test_edges_follow_the_agent_order_and_cycles_get_a_fixed_order():
    t = team(("b", "a", "one_way"), ("c", "a", "final_only"), ("b", "c", "interactive"))
    assert agent_order(t) == ["b", "c", "a"]
    assert [(e.source, e.target) for e in edge_order(t)] == [("b", "c"), ("b", "a"), ("c", "a")]
    cyc = team(("a", "b", "one_way"), ("b", "c", "one_way"), ("c", "a", "one_way"))
    assert is_cyclic(cyc) and agent_order(cyc) == ["a", "b", "c"]
    assert [(e.source, e.target) for e in edge_order(cyc)] == [("a", "b"), ("b", "c"), ("c", "a")]


# ------------------------------------------------------------------- protocols × branches
PROTOCOL_CASES = [
    # protocol, sender (answer, level), receiver (answer, level), revisions, expected
    # [(sender, receiver, branch)], receiver's final answer
    ("final_only", ("g", 2), ("x", 0), [], [], "x"),
    ("one_way", ("g", 2), ("x", 0), [], [("s", "r", "adopt")], "g"),
    ("one_way", ("x", 0), ("g", 2), [], [("s", "r", "keep")], "g"),
    ("one_way", ("g", 0), ("g", 2), [], [("s", "r", "equal")], "g"),
    ("one_way", (None, 2), ("x", 0), [], [("s", "r", "no_answer")], "x"),
    ("one_way", ("g", 1), ("x", 0), ["y"], [("s", "r", "revise")], "y"),
    ("interactive", ("g", 2), ("x", 0), [], [("s", "r", "adopt")], "g"),
    ("interactive", ("x", 0), ("g", 2), [], [("s", "r", "keep")], "g"),
    ("interactive", ("g", 1), ("g", 0), [], [("s", "r", "equal")], "g"),
    # revise, then the reverse direction meets agreement
    ("interactive", ("g", 1), ("x", 0), ["g"], [("s", "r", "revise"), ("r", "s", "equal")], "g"),
    # revise twice (alternating directions), stopped by r_max = 2
    ("interactive", ("g", 0), ("x", 0), ["y", "z"], [("s", "r", "revise"), ("r", "s", "revise")], "y"),
]


@pytest.mark.parametrize(("protocol", "s", "r", "revs", "expected", "final"), PROTOCOL_CASES)
def test_protocols_run_their_gates(protocol, s, r, revs, expected, final):
    t = team(("s", "r", protocol))
    reviser = Reviser(*revs)
    out = communicate(
        t, {"s": held("s", *s), "r": held("r", *r)}, reviser, correct, kappa=1.0, r_max=2, r_comm=3
    )
    assert [(g.sender, g.receiver, g.branch) for g in out.gates] == expected
    assert [g.round for g in out.gates] == list(range(1, len(expected) + 1))
    assert out.holdings["r"].candidate.answer == final
    assert len(reviser.calls) == len(revs) and reviser.answers == []
    assert len(out.gates) <= {"final_only": 0, "one_way": 1, "interactive": 2}[protocol]
    assert all(c[3] == protocol for c in reviser.calls)
    assert out.sweeps == 1 and out.stopped is None


def test_adoption_copies_the_senders_version_and_records():
    s = held("s", "g", 2)
    out = communicate(team(("s", "r", "one_way")), {"s": s, "r": held("r", "x")}, Reviser(),
                      correct, kappa=1.0, r_max=2, r_comm=1)
    assert out.holdings["r"] == s  # same version id, same record ids: no new verification event


def test_each_update_sees_the_state_the_previous_one_left():
    """a → b adopts, then b → c carries a's checked answer on (one sweep, fixed order)."""
    t = team(("a", "b", "one_way"), ("b", "c", "one_way"))
    h = {"a": held("a", "g", 2), "b": held("b", "x"), "c": held("c", "y")}
    out = communicate(t, h, Reviser(), correct, kappa=1.0, r_max=2, r_comm=1)
    assert [g.branch for g in out.gates] == ["adopt", "adopt"]
    assert out.holdings["c"] == h["a"]


def test_a_cyclic_team_is_swept_at_most_r_comm_times_and_stops_at_a_fixed_point():
    cyc = team(("a", "b", "one_way"), ("b", "a", "one_way"))
    reviser = Reviser(*"pqrstuvw")
    out = communicate(cyc, {"a": held("a", "x"), "b": held("b", "y")}, reviser, correct,
                      kappa=1.0, r_max=2, r_comm=3)
    assert out.sweeps == 3 and len(out.gates) == 6 and {g.sweep for g in out.gates} == {1, 2, 3}
    settled = communicate(cyc, {"a": held("a", "g", 2), "b": held("b", "y")}, Reviser(), correct,
                          kappa=1.0, r_max=2, r_comm=3)
    assert settled.sweeps == 2  # sweep 2 changed nothing
    acyclic = communicate(team(("a", "b", "one_way")), {"a": held("a", "x"), "b": held("b", "y")},
                          Reviser("z"), correct, kappa=1.0, r_max=2, r_comm=5)
    assert acyclic.sweeps == 1


def test_budget_exhaustion_stops_the_schedule_with_the_current_candidates():
    t = team(("a", "b", "one_way"), ("b", "c", "one_way"))
    h = {"a": held("a", "x"), "b": held("b", "y"), "c": held("c", "z")}
    out = communicate(t, h, Reviser("w", budget=1), correct, kappa=1.0, r_max=2, r_comm=1)
    assert out.stopped == "execution budget exhausted"
    assert len(out.gates) == 1 and out.holdings["b"].candidate.answer == "w"
    assert out.holdings["c"] == h["c"]


def test_the_gate_log_records_answers_and_correctness():
    out = communicate(team(("s", "r", "one_way")), {"s": held("s", "x", 2), "r": held("r", "g")},
                      Reviser(), correct, kappa=1.0, r_max=2, r_comm=1)
    (g,) = out.gates
    assert (g.source, g.target, g.protocol, g.branch, g.delta) == ("s", "r", "one_way", "adopt", 2)
    assert (g.sender_answer, g.before_answer, g.after_answer) == ("x", "g", "x")
    assert (g.sender_correct, g.before_correct, g.after_correct) == (False, True, False)
    assert g.to_dict()["branch"] == "adopt"


# -------------------------------------------------------------------------- gate summary
def test_gate_summary_rates_match_an_independent_count_and_the_flip_identity():
    rng = random.Random(7)
    rows = []
    for _ in range(400):
        ls, lr = rng.randint(0, 2), rng.randint(0, 2)
        s_ok, r_ok = rng.random() < 0.5, rng.random() < 0.5
        s = held("s", "g" if s_ok else "w1", ls)
        r = held("r", "g" if r_ok else "w2", lr)
        out = communicate(team(("s", "r", "one_way")), {"s": s, "r": r},
                          Reviser(rng.choice(["g", "w3"])), correct, kappa=1.0, r_max=1, r_comm=1)
        rows += out.gates
    summary = gate_summary(rows)
    C = [g for g in rows if g.before_correct and not g.sender_correct]
    adopt = sum(g.branch == "adopt" for g in C) / len(C)
    J = [g for g in C if g.branch == "revise"]
    c_j = sum(not g.after_correct for g in J) / len(J)
    flip = sum(not g.after_correct for g in C) / len(C)
    assert summary["C"] == len(C) and summary["gates"] == len(rows)
    assert math.isclose(summary["false_adoption"], adopt)
    assert math.isclose(summary["revision_error"], c_j)
    assert math.isclose(summary["flip_rate"], flip)
    assert math.isclose(flip, adopt + len(J) / len(C) * c_j)  # paper Eq. 9
    assert sum(summary[b] for b in ("equal", "no_answer", "adopt", "keep", "revise")) == len(rows)
    assert math.isnan(gate_summary([])["false_adoption"])
