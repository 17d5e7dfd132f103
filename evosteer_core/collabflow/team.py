"""CollabFlow teams: profiles, the add-only construction actions, their legal set, the canonical
team and its removable components (docs/collabflow.md §1).

A team is built before it runs. Every precondition of a construction action is *local* (the
entities it references exist, it is not present yet, a cap is not reached), so a component is
removable from a finished team exactly when nothing left references it; the forward legal set
(director) and the backward removals (b_φ) therefore describe the same set of construction
orders, which the trajectory-balance objective relies on. Agent ids are profile ids: each
profile is used at most once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

import yaml

from evosteer_core.episode.actions import canonical_json

PROTOCOLS: tuple[str, ...] = ("final_only", "one_way", "interactive")
"""Edge protocols: how many evidence gates an edge runs (0, 1, ≤ r_max)."""
OUTPUT_MODES: tuple[str, ...] = ("single", "integrator", "verifier", "formatter")
AGENT_MODES: tuple[str, ...] = ("stateless", "executor", "advisor")
KINDS: tuple[str, ...] = ("add_agent", "add_edge", "bind_skill", "set_output", "stop")


@dataclass(frozen=True)
class Profile:
    """One fixed agent profile: a role of the role catalogue plus how it executes.

    ``mode`` is ``stateless`` (answers a stateless task), ``executor`` (the single writer of an
    interactive task's environment) or ``advisor`` (read-only, acts through the executor);
    ``outputs`` are the output modes the profile may serve as (``single``, ``verifier``,
    ``formatter``); ``families`` are the task families it is compatible with.
    """

    profile_id: str
    role_id: str
    mode: str
    families: tuple[str, ...]
    outputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in AGENT_MODES:
            raise ValueError(
                f"profile {self.profile_id!r}: mode must be one of {AGENT_MODES}, got {self.mode!r}"
            )
        bad = [o for o in self.outputs if o not in OUTPUT_MODES or o == "integrator"]
        if bad:
            raise ValueError(
                f"profile {self.profile_id!r}: outputs {bad} not in single/verifier/formatter"
            )


def profiles_from_dict(data: dict[str, Any], where: str = "profiles") -> tuple[Profile, ...]:
    """``{"profiles": [...]}`` → profiles; errors name the file and the bad entry."""
    try:
        out = tuple(
            Profile(
                **{**p, "families": tuple(p["families"]), "outputs": tuple(p.get("outputs", ()))}
            )
            for p in data["profiles"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: malformed profile list: {exc}") from exc
    ids = [p.profile_id for p in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{where}: profile ids must be unique, got {ids}")
    return out


def default_profiles() -> tuple[Profile, ...]:
    """The reference profiles shipped as ``evosteer_core/data/collab_profiles.yaml``."""
    text = resources.files("evosteer_core.data").joinpath("collab_profiles.yaml").read_text()
    return profiles_from_dict(yaml.safe_load(text), where="evosteer_core/data/collab_profiles.yaml")


@dataclass(frozen=True, order=True)
class TeamEdge:
    """A directed, protocol-labelled communication relation: ``source`` sends to ``target``."""

    source: str
    target: str
    protocol: str


@dataclass(frozen=True, order=True)
class OutputRule:
    """How the team's answer is produced: ``single``/``verifier``/``formatter`` name an agent;
    ``integrator`` pools every agent's final candidate and needs none."""

    mode: str
    agent: str | None = None


@dataclass(frozen=True)
class Team:
    """An (partial or complete) team; immutable, grown one component at a time."""

    agents: frozenset[str] = frozenset()
    edges: frozenset[TeamEdge] = frozenset()
    bindings: frozenset[tuple[str, str]] = frozenset()
    output: OutputRule | None = None

    def canonical(self) -> dict[str, Any]:
        """The order-free description: sorted agents, edges, bindings and the output rule."""
        return {
            "agents": sorted(self.agents),
            "edges": [[e.source, e.target, e.protocol] for e in sorted(self.edges)],
            "bindings": [list(b) for b in sorted(self.bindings)],
            "output": None if self.output is None else [self.output.mode, self.output.agent],
        }

    def team_hash(self) -> str:
        """sha256 of the canonical JSON: histories that differ only in order share it."""
        return hashlib.sha256(canonical_json(self.canonical()).encode()).hexdigest()

    def size(self) -> int:
        """Number of components (agents, edges, bindings, the output): the actions to build it."""
        return len(self.agents) + len(self.edges) + len(self.bindings) + int(self.output is not None)

    def references(self, agent: str) -> bool:
        """Whether any edge, binding or the output refers to ``agent``."""
        return (
            any(agent in (e.source, e.target) for e in self.edges)
            or any(b[0] == agent for b in self.bindings)
            or (self.output is not None and self.output.agent == agent)
        )


@dataclass(frozen=True)
class BuildAction:
    """One construction action; ``text()`` is the string the director scores."""

    kind: str
    args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        arity = {"add_agent": (1,), "add_edge": (3,), "bind_skill": (2,), "set_output": (1, 2)}
        if self.kind not in KINDS:
            raise ValueError(f"unknown construction action kind {self.kind!r}; expected {KINDS}")
        if len(self.args) not in arity.get(self.kind, (0,)):
            raise ValueError(f"{self.kind} takes {arity.get(self.kind, (0,))} arguments, got {self.args}")

    def text(self) -> str:
        return "stop" if self.kind == "stop" else f"{self.kind}({', '.join(self.args)})"

    @classmethod
    def parse(cls, text: str) -> BuildAction:
        """Inverse of :meth:`text`; errors quote the text."""
        text = text.strip()
        if text == "stop":
            return cls("stop")
        m = re.fullmatch(r"([a-z_]+)\((.*)\)", text)
        if m is None:
            raise ValueError(f"not a construction action: {text!r}")
        args = tuple(a.strip() for a in m.group(2).split(",")) if m.group(2).strip() else ()
        return cls(m.group(1), args)


STOP = BuildAction("stop")


@dataclass(frozen=True)
class TeamSpec:
    """What one task's construction may use (the resource context χ of docs/collabflow.md §1):
    the compatible profiles, bindable skills, permitted protocols and output modes, and caps."""

    family: str
    interactive: bool
    profiles: tuple[Profile, ...]
    skills: tuple[str, ...] = ()
    protocols: tuple[str, ...] = PROTOCOLS
    output_modes: tuple[str, ...] = OUTPUT_MODES
    max_agents: int = 4
    max_edges: int = 6
    max_skills_per_agent: int = 1
    _by_id: dict[str, Profile] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {p.profile_id: p for p in self.profiles})

    def profile(self, agent: str) -> Profile:
        return self._by_id[agent]


def team_spec(
    family: str, interactive: bool, profiles: Iterable[Profile], **limits: Any
) -> TeamSpec:
    """The spec of a task of ``family``: only profiles compatible with it, in profile order;
    interactive tasks take executor/advisor profiles, stateless tasks stateless ones."""
    modes = {"executor", "advisor"} if interactive else {"stateless"}
    chosen = tuple(p for p in profiles if family in p.families and p.mode in modes)
    if not chosen:
        raise ValueError(f"no CollabFlow profile is compatible with family {family!r}")
    spec = TeamSpec(family=family, interactive=interactive, profiles=chosen, **limits)
    if spec.interactive:
        spec = replace(spec, output_modes=("single",))
    return spec


class IllegalBuildError(ValueError):
    """A construction action outside the legal set; the message names the rule it breaks."""


def _why_illegal(team: Team, action: BuildAction, spec: TeamSpec) -> str | None:
    """None if ``action`` is legal at ``team``, else the broken rule (the one legality rule)."""
    kind, args = action.kind, action.args
    if kind == "stop":
        return incomplete_reason(team, spec)
    if kind == "add_agent":
        (a,) = args
        if a not in spec._by_id:
            return f"profile {a!r} is not available for family {spec.family!r}"
        if a in team.agents:
            return f"agent {a!r} is already in the team (each profile at most once)"
        if len(team.agents) >= spec.max_agents:
            return f"the team already has max_agents = {spec.max_agents} agents"
        if spec.profile(a).mode == "executor" and any(
            spec.profile(x).mode == "executor" for x in team.agents
        ):
            return "a stateful team has at most one executor (single writer)"
        return None
    if kind == "add_edge":
        i, j, p = args
        if i not in team.agents or j not in team.agents:
            return f"both endpoints of {i}→{j} must be agents of the team"
        if i == j:
            return "an agent does not send to itself"
        if p not in spec.protocols:
            return f"protocol {p!r} is not permitted; expected one of {spec.protocols}"
        if any((e.source, e.target) == (i, j) for e in team.edges):
            return f"the team already has an edge {i}→{j}"
        if len(team.edges) >= spec.max_edges:
            return f"the team already has max_edges = {spec.max_edges} edges"
        if spec.interactive and not (
            spec.profile(i).mode == "advisor"
            and spec.profile(j).mode == "executor"
            and p == "one_way"
        ):
            return "in a stateful team only advisor → executor one_way edges exist"
        return None
    if kind == "bind_skill":
        a, k = args
        if a not in team.agents:
            return f"agent {a!r} is not in the team"
        if k not in spec.skills:
            return f"skill {k!r} is not in the library offered to this task"
        if (a, k) in team.bindings:
            return f"skill {k!r} is already bound to {a!r}"
        if sum(b[0] == a for b in team.bindings) >= spec.max_skills_per_agent:
            return f"agent {a!r} already carries max_skills_per_agent = {spec.max_skills_per_agent}"
        return None
    # set_output
    mode = args[0]
    if team.output is not None:
        return "the output rule is already set"
    if mode not in spec.output_modes:
        return f"output mode {mode!r} is not permitted; expected one of {spec.output_modes}"
    if mode == "integrator":
        return None if len(args) == 1 else "set_output(integrator) takes no agent"
    if len(args) != 2:
        return f"set_output({mode}, agent) needs the agent"
    a = args[1]
    if a not in team.agents:
        return f"output agent {a!r} is not in the team"
    if mode not in spec.profile(a).outputs:
        return f"profile {a!r} cannot serve as the {mode} output"
    if spec.interactive and spec.profile(a).mode != "executor":
        return "a stateful team's output is its executor"
    return None


def incomplete_reason(team: Team, spec: TeamSpec) -> str | None:
    """None if ``team`` is a complete valid team (stop is legal), else why not."""
    if not team.agents:
        return "the team has no agent"
    if team.output is None:
        return "the output rule is not set"
    if spec.interactive and sum(spec.profile(a).mode == "executor" for a in team.agents) != 1:
        return "a stateful team needs exactly one executor"
    return None


def is_complete(team: Team, spec: TeamSpec) -> bool:
    return incomplete_reason(team, spec) is None


def candidate_actions(team: Team, spec: TeamSpec) -> list[BuildAction]:
    """Every action of the registry over the spec's names (legal or not), in a fixed order."""
    ids = [p.profile_id for p in spec.profiles]
    out = [BuildAction("add_agent", (a,)) for a in ids]
    members = sorted(team.agents)
    out += [
        BuildAction("add_edge", (i, j, p)) for i in members for j in members for p in spec.protocols
    ]
    out += [BuildAction("bind_skill", (a, k)) for a in members for k in spec.skills]
    for mode in spec.output_modes:
        if mode == "integrator":
            out.append(BuildAction("set_output", (mode,)))
        else:
            out += [BuildAction("set_output", (mode, a)) for a in members]
    out.append(STOP)
    return out


def legal_actions(team: Team, spec: TeamSpec) -> tuple[BuildAction, ...]:
    """The legal set U_c(v): every registry action that passes the construction checks."""
    return tuple(a for a in candidate_actions(team, spec) if _why_illegal(team, a, spec) is None)


def apply(team: Team, action: BuildAction, spec: TeamSpec) -> Team:
    """The team after a legal non-stop action; anything else raises :class:`IllegalBuildError`."""
    reason = _why_illegal(team, action, spec)
    if reason is not None:
        raise IllegalBuildError(f"illegal construction action {action.text()}: {reason}")
    return _added(team, action)


def _added(team: Team, action: BuildAction) -> Team:
    kind, args = action.kind, action.args
    if kind == "add_agent":
        return replace(team, agents=team.agents | {args[0]})
    if kind == "add_edge":
        return replace(team, edges=team.edges | {TeamEdge(*args)})
    if kind == "bind_skill":
        return replace(team, bindings=team.bindings | {(args[0], args[1])})
    if kind == "set_output":
        return replace(team, output=OutputRule(args[0], args[1] if len(args) > 1 else None))
    return team  # stop changes nothing


def decode(actions: Sequence[BuildAction], spec: TeamSpec) -> Team:
    """Replay a construction history with every check; the last action must be ``stop``."""
    team = Team()
    for a in actions:
        team = apply(team, a, spec)
    if not actions or actions[-1] != STOP:
        raise IllegalBuildError("a construction history ends with stop")
    return team


def components(team: Team) -> list[BuildAction]:
    """Every component of ``team`` as the add action that builds it (agents, edges, bindings,
    output), in canonical order."""
    out = [BuildAction("add_agent", (a,)) for a in sorted(team.agents)]
    out += [BuildAction("add_edge", (e.source, e.target, e.protocol)) for e in sorted(team.edges)]
    out += [BuildAction("bind_skill", b) for b in sorted(team.bindings)]
    if team.output is not None:
        o = team.output
        out.append(BuildAction("set_output", (o.mode,) if o.agent is None else (o.mode, o.agent)))
    return out


def removable(team: Team) -> tuple[BuildAction, ...]:
    """O(G): the components that can be the last one added — every edge, binding and the
    output, and each agent nothing left references (as the add actions that built them)."""
    return tuple(
        a for a in components(team) if a.kind != "add_agent" or not team.references(a.args[0])
    )


def remove(team: Team, action: BuildAction) -> Team:
    """The team without one removable component (the inverse of adding it)."""
    if action not in removable(team):
        raise IllegalBuildError(f"{action.text()} is not a removable component of this team")
    kind, args = action.kind, action.args
    if kind == "add_agent":
        return replace(team, agents=team.agents - {args[0]})
    if kind == "add_edge":
        return replace(team, edges=team.edges - {TeamEdge(*args)})
    if kind == "bind_skill":
        return replace(team, bindings=team.bindings - {(args[0], args[1])})
    return replace(team, output=None)
