"""The communication graph (docs/method.md §1.1, Def. 1) and its canonical structure keys (§1.7)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from evosteer_core.episode.actions import canonical_json
from evosteer_core.executors.base import NodeResult


def node_index(node_id: str) -> int:
    """``"n12"`` → 12. Node ids are ``n`` + a non-negative integer, never reused."""
    if not node_id.startswith("n") or not node_id[1:].isdigit():
        raise ValueError(f"malformed node id {node_id!r}; expected 'n<integer>'")
    return int(node_id[1:])


@dataclass
class Node:
    """A live agent: role, bound skills (in binding order), and its latest execution."""

    node_id: str
    role_id: str
    skills: list[str] = field(default_factory=list)
    output: str | None = None
    version: int = 0
    last_result: NodeResult | None = None

    @property
    def answer(self) -> str | None:
        return self.last_result.answer if self.last_result is not None else None

    @property
    def status(self) -> str | None:
        return self.last_result.status if self.last_result is not None else None


@dataclass(frozen=True, order=True)
class Edge:
    source: str
    target: str
    protocol: str


class CommGraph:
    """Nodes keyed by id (in creation order), at most one edge per ordered pair, one output."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.edges: dict[tuple[str, str], Edge] = {}
        self.output_id: str | None = None
        self.next_index = 0

    def next_node_id(self) -> str:
        return f"n{self.next_index}"

    def add_node(self, role_id: str, skill_id: str | None = None) -> Node:
        node = Node(self.next_node_id(), role_id, [skill_id] if skill_id else [])
        self.nodes[node.node_id] = node
        self.next_index += 1
        return node

    def drop_node(self, node_id: str) -> None:
        del self.nodes[node_id]
        self.edges = {k: e for k, e in self.edges.items() if node_id not in k}
        if self.output_id == node_id:
            self.output_id = None

    def add_edge(self, source: str, target: str, protocol: str) -> Edge:
        edge = Edge(source, target, protocol)
        self.edges[(source, target)] = edge
        return edge

    def inbound(self, node_id: str) -> list[Edge]:
        """Edges into ``node_id``, ordered by source index."""
        into = [e for e in self.edges.values() if e.target == node_id]
        return sorted(into, key=lambda e: node_index(e.source))

    def canonical(self) -> dict:
        """The graph without ids or texts: nodes renumbered 0..n-1 by id order (docs/method.md §1.7)."""
        order = sorted(self.nodes, key=node_index)
        pos = {nid: i for i, nid in enumerate(order)}
        return {
            "nodes": [
                {"role": self.nodes[n].role_id, "skills": sorted(self.nodes[n].skills)}
                for n in order
            ],
            "edges": sorted(
                [pos[e.source], pos[e.target], e.protocol] for e in self.edges.values()
            ),
            "output": pos.get(self.output_id) if self.output_id is not None else None,
        }

    def structure_keys(self, stopped: bool) -> tuple[str, str]:
        """(exact, coarse) bucket keys of docs/method.md §1.7, each carrying the open/stop marker."""
        n, e, mark = len(self.nodes), len(self.edges), "stop" if stopped else "open"
        digest = hashlib.sha256(canonical_json(self.canonical()).encode()).hexdigest()
        return f"x:{digest}:{n}:{e}:{mark}", f"c:{n}:{e}:{mark}"
