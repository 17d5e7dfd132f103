"""The resource context of one task under a run config (docs/collabflow.md §1, §5): the
:class:`TeamSpec` a construction (or a fixed team) of that task is checked against."""

from __future__ import annotations

from collections.abc import Sequence

from evosteer_core.collabflow.team import TeamSpec, default_profiles, team_spec
from evosteer_core.episode.roles import Catalogue
from evosteer_core.infra.config import CollabFlowConfig


def task_spec(
    collab: CollabFlowConfig, family: str, catalogue: Catalogue, skills: Sequence[str] = ()
) -> TeamSpec:
    """The spec of a task of ``family``: the reference profiles compatible with it, the
    offered skills, the permitted protocols (``collabflow.protocols``) and the caps."""
    return team_spec(
        family,
        catalogue.family(family).interactive,
        default_profiles(),
        skills=tuple(skills),
        protocols=tuple(collab.protocols),
        max_agents=collab.max_agents,
        max_edges=collab.max_edges,
        max_skills_per_agent=collab.max_skills_per_agent,
    )
