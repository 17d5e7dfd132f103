"""Synthetic action vocabulary and public states with realistic shapes.

They train the tiny tokenizer (``scripts/build_tiny_tokenizer.py``) and drive the policy
tests and benchmark: node ids n0..n9, the six reference roles, ``evosteer-<20 hex>`` skill
ids, both protocols, and STOP, in canonical action JSON (docs/method.md §1.2).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evosteer_core.episode.actions import PROTOCOLS, Action
from evosteer_core.episode.records import FAMILIES

ROLES: tuple[str, ...] = ("solver", "verifier", "planner", "researcher", "finalizer", "tool_user")
STATUSES: tuple[str, ...] = ("ok", "failed", "timeout", "parse_error", "pending")
_WORDS = [
    "the",
    "answer",
    "is",
    "which",
    "river",
    "flows",
    "through",
    "city",
    "compute",
    "integer",
    "sum",
    "of",
    "digits",
    "write",
    "a",
    "function",
    "that",
    "returns",
    "list",
    "patient",
    "presents",
    "with",
    "fever",
    "what",
    "year",
    "was",
    "born",
    "find",
    "object",
    "in",
    "room",
    "put",
    "it",
    "on",
    "table",
    "verify",
    "result",
    "plan",
    "steps",
    "search",
    "python",
    "output",
    "correct",
]


def skill_id(rng: np.random.Generator) -> str:
    """A skill id in the library's format: ``evosteer-`` + 20 lowercase hex digits."""
    return "evosteer-" + "".join(rng.choice(list("0123456789abcdef"), size=20))


def random_legal_set(rng: np.random.Generator, max_nodes: int = 10) -> list[str]:
    """A sorted set of distinct legal-looking action texts for a random graph of up to 10 nodes."""
    n = int(rng.integers(0, max_nodes))
    nodes = [f"n{i}" for i in range(n)]
    menu = [skill_id(rng) for _ in range(int(rng.integers(0, 4)))]
    actions: set[Action] = set()
    if n and rng.random() < 0.7:
        actions.add(Action("STOP"))
    for role in rng.permutation(ROLES)[: int(rng.integers(1, len(ROLES) + 1))]:
        actions.add(Action("ADD_AGENT", node_id=f"n{n}", role_id=str(role)))
        for skill in menu:
            actions.add(Action("ADD_AGENT", node_id=f"n{n}", role_id=str(role), skill_id=skill))
    for node in nodes:
        for kind in ("SET_OUTPUT", "RERUN_AGENT", "DROP_AGENT"):
            if rng.random() < 0.8:
                actions.add(Action(kind, node_id=node))
        for skill in menu:
            if rng.random() < 0.5:
                actions.add(Action("BIND_SKILL", node_id=node, skill_id=skill))
        for other in nodes:
            for protocol in PROTOCOLS:
                if other != node and rng.random() < 0.4:
                    actions.add(
                        Action("ADD_EDGE", source_id=node, target_id=other, protocol=protocol)
                    )
    return sorted(a.to_json() for a in actions)


def _sentence(rng: np.random.Generator, words: int) -> str:
    return " ".join(rng.choice(_WORDS, size=words))


def random_public_state(rng: np.random.Generator) -> dict[str, Any]:
    """A public episode state (the ``policy.render.public_state`` contract) with random content."""
    legal = random_legal_set(rng)
    n = int(rng.integers(0, 6))
    nodes = [
        {
            "id": f"n{i}",
            "role": str(rng.choice(ROLES)),
            "skills": [skill_id(rng) for _ in range(int(rng.integers(0, 2)))],
            "status": str(rng.choice(STATUSES)),
            "answer": None if rng.random() < 0.3 else str(int(rng.integers(0, 1000))),
            "output": _sentence(rng, int(rng.integers(5, 40))),
        }
        for i in range(n)
    ]
    edges = [
        [f"n{i}", f"n{j}", str(rng.choice(PROTOCOLS))]
        for i in range(n)
        for j in range(n)
        if i != j and rng.random() < 0.2
    ]
    history = [
        f"{rng.choice(legal)} -> {_sentence(rng, int(rng.integers(2, 8)))}"
        for _ in range(int(rng.integers(0, 8)))
    ]
    return {
        "family": str(rng.choice(FAMILIES)),
        "task": _sentence(rng, int(rng.integers(8, 60))),
        "roles": list(ROLES),
        "skill_menu": [
            {"id": skill_id(rng), "name": _sentence(rng, 3), "trigger": _sentence(rng, 6)}
            for _ in range(int(rng.integers(0, 4)))
        ],
        "graph": {"nodes": nodes, "edges": edges, "output": nodes[0]["id"] if nodes else None},
        "history": history,
        "features": [float(x) for x in rng.random(30)],
        "budget": {
            "tokens_used_frac": float(rng.random()),
            "tool_calls_used_frac": float(rng.random()),
            "wall_used_frac": float(rng.random()),
            "model_calls_used_frac": float(rng.random()),
        },
        "value": float(rng.random()) if rng.random() < 0.9 else None,
        "value_change": float(rng.normal(0, 0.1)) if rng.random() < 0.9 else None,
        "legal_actions": legal,
    }
