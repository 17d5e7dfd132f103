"""Prompt renderers: the orchestrator's view of a public episode state (docs/method.md §1.6).

The input is the dict :func:`public_state` builds from an episode (keys: family, task, roles,
skill_menu, graph, history, features, budget, value, value_change, legal_actions).
Every rendered prompt is ``system text + SYSTEM_SEPARATOR + body``; the system text contains
no ``SYSTEM_SEPARATOR``, so prompt truncation can keep it while cutting the body from the left.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from evosteer_core.episode.actions import canonical_json
from evosteer_core.episode.features import execution_features
from evosteer_core.episode.runtime import Episode
from evosteer_core.executors.base import SkillView

SYSTEM_SEPARATOR = "\n\n"
"""Ends the system text of every prompt (the first occurrence marks its end)."""

OUTPUT_EDGE_CHARS = 1200
"""A node output longer than twice this is shown as its first and last this many characters."""

COMPACT_HISTORY = 4
"""How many of the latest history entries the compact renderer shows."""

COMPACT_TASK_CHARS = 64
"""The task's head; small backbones read the family line, not the task text."""
COMPACT_ANSWER_CHARS = 24
COMPACT_HISTORY_CHARS = 120
COMPACT_SKILL_CHARS = 6
"""Compact prompts show a skill id by its first hex digits (the grammar mask completes it)."""

SYSTEM_FULL = (
    "You orchestrate a team of language-model agents that solve one task together. "
    "The state below lists the task, the roles, the skill menu, the communication graph "
    "(nodes, edges, output node), the action history with observations, the execution "
    "features, the budget used, the reference value and its change, and the legal actions. "
    "Reply with exactly one legal action as canonical JSON."
)
SYSTEM_COMPACT = "Orchestrate agents. Reply with one legal action as JSON."

_REQUIRED_KEYS = (
    "family",
    "task",
    "roles",
    "skill_menu",
    "graph",
    "history",
    "features",
    "budget",
    "value",
    "value_change",
    "legal_actions",
)

WITHHOLDABLE = ("features", "value", "value_change")
"""State keys an ablation may leave out of the prompt (docs/ablations.md): f (ablation
``no_execution_features``), v̂ and Δv̂ (``no_value_head``)."""


def public_state(
    ep: Episode,
    value: float | None = None,
    value_change: float | None = None,
    withhold: Collection[str] = (),
) -> dict[str, Any]:
    """The policy-visible state of an episode (docs/method.md §1.6): what every renderer
    reads, with the reference value ``value`` and its change since the last decision, less
    the keys in ``withhold`` (a subset of :data:`WITHHOLDABLE`)."""
    bad = set(withhold) - set(WITHHOLDABLE)
    if bad:
        raise ValueError(f"cannot withhold {sorted(bad)}; withholdable: {list(WITHHOLDABLE)}")
    g = ep.graph
    state = {
        "family": ep.task.family,
        "task": ep.task.orchestrator_text,
        "roles": [r.role_id for r in ep.roles],
        "skill_menu": [{"id": s.skill_id, "name": s.name, "trigger": _trigger(s)} for s in ep.menu],
        "graph": {
            "nodes": [
                {
                    "id": n.node_id,
                    "role": n.role_id,
                    "skills": list(n.skills),
                    "status": n.status,
                    "answer": n.answer,
                    "output": n.output,
                }
                for n in g.nodes.values()
            ],
            "edges": [[e.source, e.target, e.protocol] for e in g.edges.values()],
            "output": g.output_id,
        },
        "history": [o.summary() for o in ep.history],
        "features": [float(x) for x in execution_features(ep)],
        "budget": dict(
            zip(
                (
                    "tokens_used_frac",
                    "tool_calls_used_frac",
                    "wall_used_frac",
                    "model_calls_used_frac",
                ),
                ep.ledger.used_fractions(),
                strict=True,
            )
        ),
        "value": value,
        "value_change": value_change,
        "legal_actions": [a.to_json() for a in ep.legal_actions()],
    }
    return {k: v for k, v in state.items() if k not in withhold}


def _trigger(skill: SkillView) -> str:
    """The "use when" line of a rendered skill (the menu shows id, name and trigger)."""
    for line in skill.rendered.splitlines():
        if line.lower().startswith("use when"):
            return line.split(":", 1)[-1].strip()
    return ""


def _check_state(state: dict[str, Any]) -> None:
    missing = [k for k in _REQUIRED_KEYS if k not in state and k not in WITHHOLDABLE]
    if missing:
        raise ValueError(f"public state lacks keys {missing}; expected {list(_REQUIRED_KEYS)}")
    if "features" in state and len(state["features"]) != 30:
        raise ValueError(
            f"public state 'features' has {len(state['features'])} values, expected 30"
        )


def clip_output(text: str | None, edge: int = OUTPUT_EDGE_CHARS) -> str | None:
    """First and last ``edge`` characters of a long text, joined by an elision mark."""
    if text is None or len(text) <= 2 * edge:
        return text
    return f"{text[:edge]}\n[... {len(text) - 2 * edge} characters omitted ...]\n{text[-edge:]}"


def render_full(state: dict[str, Any]) -> str:
    """System text + canonical JSON of the whole public state, node outputs clipped."""
    _check_state(state)
    graph = dict(state["graph"])
    graph["nodes"] = [
        {**node, "output": clip_output(node.get("output"))} for node in graph["nodes"]
    ]
    return SYSTEM_FULL + SYSTEM_SEPARATOR + canonical_json({**state, "graph": graph})


def _rounded(x: float | None) -> str:
    return "none" if x is None else f"{x:.2f}"


def _short_skill(skill_id: str) -> str:
    return skill_id.removeprefix("evosteer-")[:COMPACT_SKILL_CHARS]


def _node_line(node: dict[str, Any]) -> str:
    skills = ",".join(_short_skill(s) for s in node.get("skills") or []) or "-"
    answer = node.get("answer")
    answer = "-" if answer is None else str(answer)[:COMPACT_ANSWER_CHARS]
    return f"{node['id']} {node['role']} {node.get('status', '-')} skills={skills} ans={answer}"


def feature_digits(features: list[float]) -> str:
    """One digit per feature in [0, 1] (round(9x)): 30 characters, about 3x fewer tokens than
    the decimals (27 vs 91 tiny-tokenizer tokens); the budget fractions are features 26-29, so no separate budget line."""
    return "".join(str(round(9 * min(1.0, max(0.0, x)))) for x in features)


def render_compact(state: dict[str, Any], task_chars: int = COMPACT_TASK_CHARS) -> str:
    """A short text for small backbones: family, the task's first ``task_chars`` characters (no
    task line at 0), graph summary, features, v̂, Δv̂, recent actions."""
    _check_state(state)
    graph = state["graph"]
    edges = " ".join(f"{s}>{t}:{p}" for s, t, p in graph["edges"]) or "-"
    menu = " ".join(_short_skill(item["id"]) for item in state["skill_menu"]) or "-"
    lines = [
        f"family {state['family']}",
        *([f"task {state['task'][:task_chars]}"] if task_chars > 0 else []),
        f"roles {' '.join(state['roles'])}",
        f"skills {menu}",
        *(_node_line(node) for node in graph["nodes"]),
        f"edges {edges}",
        f"output {graph['output'] or '-'}",
        *(["f " + feature_digits(state["features"])] if "features" in state else []),
        *_value_line(state),
        *(f"> {entry[:COMPACT_HISTORY_CHARS]}" for entry in state["history"][-COMPACT_HISTORY:]),
        "action:",
    ]
    return SYSTEM_COMPACT + SYSTEM_SEPARATOR + "\n".join(lines)


def _value_line(state: dict[str, Any]) -> list[str]:
    """``v <v̂> dv <Δv̂>``, with what the state withholds left out (no line for neither)."""
    parts = [
        f"{label} {_rounded(state[key])}"
        for label, key in (("v", "value"), ("dv", "value_change"))
        if key in state
    ]
    return [" ".join(parts)] if parts else []


def render_compact_no_task(state: dict[str, Any]) -> str:
    """The compact text without the task line, for backbones that cannot read a task: a
    from-scratch model only memorizes tasks by their text (and a simulated task's tag names its
    split), which does not carry over to new tasks (docs/policy.md)."""
    return render_compact(state, task_chars=0)


RENDERERS = {
    "full": render_full,
    "compact": render_compact,
    "compact_no_task": render_compact_no_task,
}


def render(state: dict[str, Any], kind: str) -> str:
    """Render with the renderer named ``kind`` (a key of ``RENDERERS``)."""
    if kind not in RENDERERS:
        raise ValueError(f"unknown renderer {kind!r}; expected one of {sorted(RENDERERS)}")
    return RENDERERS[kind](state)
