"""The fixed teams of CollabFlow's comparison rows (docs/collabflow.md §5): teams fixed before
execution, built with the construction actions of :mod:`evosteer_core.collabflow.team`, so each
one is a legal team of the task's spec and runs through the same executor, budget and seeds as
a constructed team.

A team depends on the task's spec: a profile a family does not offer is replaced by the next
one of the team's preference list, and a stateful (interactive) task gets the single-writer
form of the team (one executor; advisors reach it through advisor → executor one_way edges).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations

from evosteer_core.collabflow.team import STOP, BuildAction, Team, TeamSpec, decode

VOTERS = 3
"""k of the parallel vote: the number of independent solvers (distinct profiles: a profile
is used at most once)."""


def _available(spec: TeamSpec, preference: Sequence[str], k: int) -> list[str]:
    """The first ``k`` profiles of ``preference`` the spec offers (fewer if it offers fewer)."""
    offered = {p.profile_id for p in spec.profiles}
    return [p for p in preference if p in offered][:k]


def _agents(agents: Sequence[str]) -> list[BuildAction]:
    return [BuildAction("add_agent", (a,)) for a in agents]


def _stateful(spec: TeamSpec, advisors: bool) -> list[BuildAction]:
    """The executor alone, or with every advisor the spec offers (advisor → executor one_way)."""
    (writer,) = [p.profile_id for p in spec.profiles if p.mode == "executor"]
    helpers = [p.profile_id for p in spec.profiles if p.mode == "advisor"] if advisors else []
    edges = [BuildAction("add_edge", (h, writer, "one_way")) for h in helpers]
    return [*_agents([writer, *helpers]), *edges, BuildAction("set_output", ("single", writer))]


def single_agent(spec: TeamSpec) -> list[BuildAction]:
    """One tool-using agent answers alone (the executor, on a stateful task)."""
    if spec.interactive:
        return _stateful(spec, advisors=False)
    (agent,) = _available(spec, ("tool_user", "solver"), 1)
    return [*_agents([agent]), BuildAction("set_output", ("single", agent))]


def parallel_vote(spec: TeamSpec) -> list[BuildAction]:
    """k independent solvers, no edges, the integrator's output (answers grouped after
    normalization; the best evidence class wins, then the larger class). A stateful task has
    one writer, so it gets the single agent."""
    if spec.interactive:
        return single_agent(spec)
    voters = _available(spec, ("solver", "tool_user", "researcher", "verifier"), VOTERS)
    return [*_agents(voters), BuildAction("set_output", ("integrator",))]


def chain(spec: TeamSpec) -> list[BuildAction]:
    """The researcher → solver → verifier chain with verbatim (final_only) messages and the
    verifier's output; a family without a researcher starts with the tool user. A stateful task
    gets the executor–advisor team (every advisor one_way into the executor)."""
    if spec.interactive:
        return _stateful(spec, advisors=True)
    (first,) = _available(spec, ("researcher", "tool_user"), 1)
    solver, verifier = "solver", "verifier"
    edges = [
        BuildAction("add_edge", (first, solver, "final_only")),
        BuildAction("add_edge", (solver, verifier, "final_only")),
    ]
    return [
        *_agents([first, solver, verifier]),
        *edges,
        BuildAction("set_output", ("verifier", verifier)),
    ]


def debate(spec: TeamSpec) -> list[BuildAction]:
    """Fully connected debate: three solvers, an interactive edge between every pair (gates in
    both directions, up to ``r_max`` rounds), the integrator's output. A stateful task gets
    the executor–advisor team (the only communication a single-writer team allows)."""
    if spec.interactive:
        return _stateful(spec, advisors=True)
    agents = sorted(_available(spec, ("solver", "researcher", "tool_user", "verifier"), VOTERS))
    edges = [BuildAction("add_edge", (i, j, "interactive")) for i, j in combinations(agents, 2)]
    return [*_agents(agents), *edges, BuildAction("set_output", ("integrator",))]


BASELINES: dict[str, Callable[[TeamSpec], list[BuildAction]]] = {
    "single_agent": single_agent,
    "parallel_vote": parallel_vote,
    "chain": chain,
    "debate": debate,
}
"""Every named fixed team (``collabflow.fixed_team``), in table order."""

BEST = "best"
"""``collabflow.fixed_team: best``: per family, the named team that scores best on the run's
training tasks (``collabflow/evaluation.fixed_teams``)."""


def baseline_actions(name: str, spec: TeamSpec) -> list[BuildAction]:
    """The construction history of team ``name`` for ``spec``, ending with stop."""
    if name not in BASELINES:
        raise ValueError(f"unknown fixed team {name!r}; known: {', '.join(BASELINES)}")
    return [*BASELINES[name](spec), STOP]


def baseline_team(name: str, spec: TeamSpec) -> Team:
    """Team ``name`` for ``spec``, replayed through every construction check (so it is a legal
    team of the spec: a spec that forbids one of its components raises IllegalBuildError)."""
    return decode(baseline_actions(name, spec), spec)
