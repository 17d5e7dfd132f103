"""The 30-d execution feature vector f(s) of docs/method.md §1.4 (Eq. 3).

Computed from an :class:`~evosteer_core.episode.runtime.Episode` alone (graph, history of observations,
skill menu, offered roles, environment, budget ledger), without any model call. It feeds the
reference value head, the flow baseline b_ψ and the policy prompt, so it runs for every decision
state and is kept to plain Python over a handful of live nodes (no per-call numpy arithmetic).

Conventions (docs/runtime.md): n = live nodes, t = executed actions (``len(history)``); every
ratio is clipped to [0, 1] and a zero denominator gives 0. "The last execution" (features 14,
24, 25) is the most recent observation that carries a node result, whatever action followed it;
features 12, 13 and 18–20 describe the last action itself.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from evosteer_core.episode.actions import KINDS
from evosteer_core.episode.answers import normalize_answer

if TYPE_CHECKING:
    from evosteer_core.episode.runtime import Episode
    from evosteer_core.executors.base import NodeResult

FEATURE_NAMES: tuple[str, ...] = (
    "node_count",
    "edge_density",
    "role_diversity",
    "bound_skill_fraction",
    "action_count",
    *(f"last_action_{k.lower()}" for k in KINDS),
    "repair_attempted",
    "repair_changed_output",
    "last_execution_failed",
    "answered_fraction",
    "output_selected",
    "answer_agreement",
    "last_output_changed",
    "communication_delivered",
    "communication_revised_output",
    "env_step_fraction",
    "env_phase_fraction",
    "env_terminal",
    "last_call_succeeded",
    "last_call_failed",
    "tokens_used",
    "tool_calls_used",
    "wall_time_used",
    "model_calls_used",
)
N_FEATURES = len(FEATURE_NAMES)
_LAST_KIND = 5
"""Index of the first one-hot slot (features 5–11 follow the order of ``actions.KINDS``)."""
_KIND_SLOT = {kind: _LAST_KIND + i for i, kind in enumerate(KINDS)}


def _ratio(num: float, den: float) -> float:
    """num/den clipped to [0, 1]; 0 for a non-positive denominator."""
    if den <= 0:
        return 0.0
    return min(1.0, max(0.0, num / den))


@lru_cache(maxsize=16384)
def _normalized(text: str) -> str:
    """Answer normalization of an output text, memoized: outputs are re-read at every state."""
    return normalize_answer(text)


def _agreement(texts: list[str]) -> float:
    """Agreeing pairs of normalized answers / C(m, 2); 0 with fewer than two answers."""
    m = len(texts)
    if m < 2:
        return 0.0
    counts = Counter(_normalized(t) for t in texts)
    agreeing = sum(c * (c - 1) for c in counts.values()) // 2
    return agreeing / (m * (m - 1) // 2)


def _call_outcome(result: NodeResult | None) -> tuple[float, float]:
    """(succeeded, failed) of the last environment step, else the last tool call, else (0, 0)."""
    if result is None:
        return 0.0, 0.0
    if result.env_steps > 0 and result.env_last_ok is not None:
        ok = result.env_last_ok
    elif result.tool_uses:
        ok = result.tool_uses[-1].ok
    else:
        return 0.0, 0.0
    return (1.0, 0.0) if ok else (0.0, 1.0)


def execution_features(episode: Episode) -> np.ndarray:
    """f(s) ∈ [0, 1]^30 (float32) of docs/method.md §1.4 for the episode's current state."""
    f = [0.0] * N_FEATURES
    graph = episode.graph
    nodes = graph.nodes.values()
    n = len(graph.nodes)
    t = len(episode.history)

    f[0] = n / (n + 1)
    f[1] = _ratio(len(graph.edges), n * (n - 1))
    f[2] = _ratio(len({node.role_id for node in nodes}), len(episode.roles))
    f[3] = _ratio(sum(len(node.skills) for node in nodes), n * max(1, len(episode.menu)))
    f[4] = t / (t + 1)

    if t:
        last = episode.history[-1]
        f[_KIND_SLOT[last.action.kind]] = 1.0
        f[12] = float(last.repair)
        f[13] = float(last.repair and last.output_changed)
        f[18] = float(last.output_changed)
        f[19] = float(last.messages > 0)
        f[20] = float(last.messages > 0 and last.had_previous_output and last.output_changed)
        last_result = next((o.result for o in reversed(episode.history) if o.result), None)
        f[14] = float(last_result is not None and last_result.status != "ok")
        f[24], f[25] = _call_outcome(last_result)

    answered = [node.output for node in nodes if node.answer is not None]
    f[15] = _ratio(len(answered), n)
    f[16] = float(graph.output_id is not None)
    f[17] = _agreement([text for text in answered if text is not None])

    env = episode.environment
    if env is not None:
        f[21] = _ratio(env.steps_done, env.max_steps)
        f[22] = min(1.0, max(0.0, float(env.phase_fraction())))
        f[23] = float(env.done)

    f[26:30] = episode.ledger.used_fractions()
    return np.array(f, dtype=np.float32)
