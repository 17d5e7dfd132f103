"""The team reward R̃ of Collaborative Trajectory Balance (docs/collabflow.md §3):

    R̃_k(G, x, ξ) = ε_min + r_ans(G, x, ξ) · (s_k(G) + 1/2) / (n_k(G) + 1) · exp(−λ L_rel(G)).

``r_ans`` ∈ [0, 1] is the answer score of the execution; (s + 1/2)/(n + 1) is the posterior
mean success rate of the team on the task's cluster under a Jeffreys Beta(1/2, 1/2) prior,
read from counters *frozen before the batch*; L_rel is a minimum-description-length structural
prior in nats. After the batch, each unique execution outcome increments the counters once.

Reading of "unique outcome": an outcome is one execution record, identified by its id (the
task record, the canonical team and the execution's seed key); a record that reaches the
update twice (copied, replayed, or shared by two histories of the same team on the same task
that ran as one execution) counts once, in this round and in every later one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from evosteer_core.collabflow.team import BuildAction, Team, TeamSpec, legal_actions, remove
from evosteer_core.episode.records import FAMILIES

CLUSTERS: tuple[str, ...] = FAMILIES
"""Task clusters c_x of the counters and of log Z_ψ: the task's family."""


def cluster_index(cluster: str) -> int:
    """The position of ``cluster`` in :data:`CLUSTERS` (one-line error otherwise)."""
    if cluster not in CLUSTERS:
        raise ValueError(f"task cluster {cluster!r}: expected one of {CLUSTERS}")
    return CLUSTERS.index(cluster)


def is_success(r_ans: float) -> bool:
    """The binary success the counters count: full answer credit (r_ans = 1). Continuous
    scores (partial credit) enter R̃ through r_ans, never the counters."""
    return r_ans >= 1.0


@dataclass(frozen=True)
class Outcome:
    """One execution record as the counters see it."""

    outcome_id: str
    team_hash: str
    cluster: str
    success: bool


def outcome_id(record_id: str, team_hash: str, execution_key: str) -> str:
    """The identity of an execution record: task record, canonical team, execution seed key."""
    return f"{record_id}|{team_hash}|{execution_key}"


def _key(team_hash: str, cluster: str) -> str:
    return f"{cluster}|{team_hash}"


@dataclass(frozen=True)
class CounterSnapshot:
    """The counters frozen before a batch: every reward of the batch reads these."""

    counts: Mapping[str, tuple[int, int]]

    def posterior(self, team_hash: str, cluster: str) -> float:
        """(s + 1/2)/(n + 1): the Jeffreys posterior mean success rate."""
        s, n = self.counts.get(_key(team_hash, cluster), (0, 0))
        return (s + 0.5) / (n + 1.0)


@dataclass
class ReliabilityCounters:
    """Success counters s, n per (task cluster, canonical team) and the ids already counted."""

    counts: dict[str, tuple[int, int]] = field(default_factory=dict)
    counted: set[str] = field(default_factory=set)

    def snapshot(self) -> CounterSnapshot:
        """A frozen copy (later updates do not reach it)."""
        return CounterSnapshot(MappingProxyType(dict(self.counts)))

    def update(self, outcomes: Iterable[Outcome]) -> int:
        """Count each outcome whose id was never counted, once; returns how many were new."""
        new = 0
        for o in outcomes:
            if o.outcome_id in self.counted:
                continue
            cluster_index(o.cluster)
            self.counted.add(o.outcome_id)
            key = _key(o.team_hash, o.cluster)
            s, n = self.counts.get(key, (0, 0))
            self.counts[key] = (s + int(o.success), n + 1)
            new += 1
        return new

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, deterministic: sorted keys and ids."""
        return {
            "counts": {k: list(self.counts[k]) for k in sorted(self.counts)},
            "counted": sorted(self.counted),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReliabilityCounters:
        """Inverse of :meth:`to_dict`; a malformed entry is named in one line."""
        counts: dict[str, tuple[int, int]] = {}
        for key, value in data.get("counts", {}).items():
            if not (isinstance(value, list | tuple) and len(value) == 2):
                raise ValueError(f"reliability counters: entry {key!r} must be [s, n], got {value!r}")
            s, n = int(value[0]), int(value[1])
            if not 0 <= s <= n:
                raise ValueError(f"reliability counters: entry {key!r} needs 0 <= s <= n, got {value!r}")
            counts[key] = (s, n)
        return cls(counts=counts, counted=set(data.get("counted", [])))


def _label_choices(team: Team, component: BuildAction, spec: TeamSpec) -> int:
    """How many labels the code can give ``component`` in ``team``: the protocols a legal
    edge between its endpoints may carry, or the skills its agent may be bound to."""
    rest = remove(team, component)
    if component.kind == "add_edge":
        i, j, _ = component.args
        return sum(a.kind == "add_edge" and a.args[:2] == (i, j) for a in legal_actions(rest, spec))
    agent = component.args[0]
    return sum(a.kind == "bind_skill" and a.args[0] == agent for a in legal_actions(rest, spec))


def relative_code_length(team: Team, spec: TeamSpec) -> float:
    """L_rel(G) in nats: G's structural code length minus the shortest in its class.

    The code describes a team given its class (its agents and output rule): each ordered
    pair of agents costs one fair bit (connected or not), each edge then names its protocol
    among those legal for that pair, and each binding names its skill among those its agent
    may take (uniform codes). The shortest team of the class has no edge and no binding, so
    L_rel = Σ_edges log(#protocols) + Σ_bindings log(#skills).
    """
    labelled = [
        BuildAction("add_edge", (e.source, e.target, e.protocol)) for e in sorted(team.edges)
    ] + [BuildAction("bind_skill", b) for b in sorted(team.bindings)]
    return sum(math.log(_label_choices(team, c, spec)) for c in labelled)


def team_reward(
    r_ans: float,
    team: Team,
    spec: TeamSpec,
    cluster: str,
    snapshot: CounterSnapshot,
    *,
    eps_min: float,
    mdl_lambda: float = 1.0,
) -> float:
    """R̃ of one execution of ``team`` on a task of ``cluster``, from the frozen snapshot."""
    if not 0.0 <= r_ans <= 1.0:
        raise ValueError(f"team reward: r_ans must be in [0, 1], got {r_ans}")
    prior = math.exp(-mdl_lambda * relative_code_length(team, spec))
    return eps_min + r_ans * snapshot.posterior(team.team_hash(), cluster) * prior

