"""Communication graph and its structure keys (docs/method.md §1.1, §1.7)."""

from __future__ import annotations

import hashlib
import json

import pytest

from evosteer_core.episode.graph import CommGraph, node_index


def _solver_verifier(*, with_gap: bool = False, reverse_edges: bool = False) -> CommGraph:
    """solver(s1,s2) -> verifier via revise, verifier -> solver via feedback, output solver.

    ``with_gap`` creates and drops extra nodes first so that every id differs;
    ``reverse_edges`` inserts edges and skills in the other order.
    """
    g = CommGraph()
    if with_gap:
        g.add_node("planner")
        g.add_node("researcher")
        g.drop_node("n0")
    solver = g.add_node("solver", "s2" if reverse_edges else "s1")
    solver.skills.append("s1" if reverse_edges else "s2")
    if with_gap:
        g.add_edge("n1", solver.node_id, "feedback")
        g.drop_node("n1")
    verifier = g.add_node("verifier")
    edges = [
        (solver.node_id, verifier.node_id, "revise"),
        (verifier.node_id, solver.node_id, "feedback"),
    ]
    for src, tgt, proto in reversed(edges) if reverse_edges else edges:
        g.add_edge(src, tgt, proto)
    g.output_id = solver.node_id
    return g


def test_node_ids_increase_and_are_never_reused() -> None:
    g = CommGraph()
    assert [g.add_node("solver").node_id for _ in range(3)] == ["n0", "n1", "n2"]
    g.drop_node("n2")
    assert g.add_node("solver").node_id == "n3"
    assert node_index("n12") == 12
    for bad in ("12", "n", "m3", "n-1", "n1a"):
        with pytest.raises(ValueError, match="node id"):
            node_index(bad)


def test_drop_removes_incident_edges_and_output() -> None:
    g = _solver_verifier()
    g.add_node("planner")
    g.add_edge("n2", "n1", "feedback")
    g.drop_node("n0")
    assert list(g.nodes) == ["n1", "n2"]
    assert list(g.edges) == [("n2", "n1")]
    assert g.output_id is None


def test_inbound_is_ordered_by_source_index() -> None:
    g = CommGraph()
    for _ in range(12):
        g.add_node("solver")
    for src in ("n11", "n2", "n10", "n0"):
        g.add_edge(src, "n5", "feedback")
    assert [e.source for e in g.inbound("n5")] == ["n0", "n2", "n10", "n11"]


def test_canonical_graph_is_renumbered_and_has_no_ids() -> None:
    g = _solver_verifier(with_gap=True)
    assert list(g.nodes) == ["n2", "n3"]
    assert g.canonical() == {
        "nodes": [{"role": "solver", "skills": ["s1", "s2"]}, {"role": "verifier", "skills": []}],
        "edges": [[0, 1, "revise"], [1, 0, "feedback"]],
        "output": 0,
    }


def test_exact_key_is_the_sha256_of_the_canonical_json() -> None:
    g = _solver_verifier()
    canon = {
        "edges": [[0, 1, "revise"], [1, 0, "feedback"]],
        "nodes": [{"role": "solver", "skills": ["s1", "s2"]}, {"role": "verifier", "skills": []}],
        "output": 0,
    }
    text = json.dumps(canon, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert g.structure_keys(stopped=False) == (f"x:{digest}:2:2:open", "c:2:2:open")


@pytest.mark.parametrize("stopped", [False, True])
def test_keys_invariant_under_renumbering_and_insertion_order(stopped: bool) -> None:
    base = _solver_verifier().structure_keys(stopped)
    assert _solver_verifier(with_gap=True).structure_keys(stopped) == base
    assert _solver_verifier(reverse_edges=True).structure_keys(stopped) == base
    assert _solver_verifier(with_gap=True, reverse_edges=True).structure_keys(stopped) == base


def _variant(change: str) -> CommGraph:
    g = _solver_verifier()
    if change == "role":
        g.nodes["n1"].role_id = "finalizer"
    elif change == "skill":
        g.nodes["n1"].skills.append("s1")
    elif change == "skill_id":
        g.nodes["n0"].skills[1] = "s3"
    elif change == "protocol":
        g.add_edge("n0", "n1", "feedback")
    elif change == "direction":
        g.edges.pop(("n1", "n0"))
        g.edges.pop(("n0", "n1"))
        g.add_edge("n1", "n0", "revise")
        g.add_edge("n0", "n1", "feedback")
    elif change == "output":
        g.output_id = "n1"
    elif change == "no_output":
        g.output_id = None
    return g


@pytest.mark.parametrize(
    "change", ["role", "skill", "skill_id", "protocol", "direction", "output", "no_output"]
)
def test_exact_key_separates_structures_with_equal_counts(change: str) -> None:
    exact, coarse = _solver_verifier().structure_keys(False)
    exact2, coarse2 = _variant(change).structure_keys(False)
    assert exact2 != exact
    assert coarse2 == coarse == "c:2:2:open"


def test_node_order_by_id_is_part_of_the_structure() -> None:
    """Renumbering follows id order (docs/method.md §1.7): the same roles created in the other order
    give a different canonical graph, while the coarse key is the same."""
    a, b = CommGraph(), CommGraph()
    for role in ("solver", "verifier"):
        a.add_node(role)
    for role in ("verifier", "solver"):
        b.add_node(role)
    a.output_id, b.output_id = "n0", "n1"
    assert a.structure_keys(False)[0] != b.structure_keys(False)[0]
    assert a.structure_keys(False)[1] == b.structure_keys(False)[1]


def test_coarse_key_and_stop_marker() -> None:
    g = _solver_verifier()
    g.add_node("planner")
    exact_open, coarse_open = g.structure_keys(stopped=False)
    exact_stop, coarse_stop = g.structure_keys(stopped=True)
    assert coarse_open == "c:3:2:open" and coarse_stop == "c:3:2:stop"
    assert exact_open.endswith(":3:2:open") and exact_stop.endswith(":3:2:stop")
    assert exact_open.split(":")[1] == exact_stop.split(":")[1]
    assert exact_open != exact_stop
    empty = CommGraph().structure_keys(stopped=True)
    assert empty[1] == "c:0:0:stop"
