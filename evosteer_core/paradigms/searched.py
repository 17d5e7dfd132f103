"""The offline-searched workflow (docs/paradigms.md, "searched"): a search over chain teams on
the TRAINING tasks, the best per task family frozen as an artifact, then run unchanged.

:func:`search_workflows` is a pure function of the config, the training records it is given
and the search settings: it builds its world on those records alone (``world_for``), so no
held-out record can reach it. Its result is plain JSON, stored content-addressed by
:func:`store_workflows`; :func:`searched_paradigm` turns it back into a paradigm.

Search space (:func:`search_space`): chains of 1..``max_nodes`` roles offered in the family
(the last one able to be the output), each node after the first re-run from its predecessor
over ``revise``, optionally with ``fan_in`` (the output also reads every earlier node) and
``rerun_output`` (one more execution of the output; not in the interactive family, where the
output keeps acting anyway). Every family's pool starts with the direct, template and
plan-then-execute teams, then ``candidates`` more drawn without replacement (seeded) from the
rest of the space. Each candidate runs on the family's first ``tasks_per_family`` training
records, ``runs`` times, every candidate under the same seeds (common random numbers), scored
by the training reward; the best mean reward wins (ties: fewer mean tokens, then pool order).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from evosteer_core.episode.actions import Action
from evosteer_core.episode.records import FAMILIES, TaskRecord
from evosteer_core.episode.roles import Catalogue
from evosteer_core.episode.rollout import EpisodePlan
from evosteer_core.episode.world import World, load_records, world_for
from evosteer_core.infra.artifacts import ArtifactRef, ArtifactStore, put_json
from evosteer_core.infra.config import RunConfig
from evosteer_core.infra.seeding import derive_seed
from evosteer_core.paradigms.base import ScriptedParadigm, TaskView, chain_script, view_of
from evosteer_core.paradigms.plan_execute import planned_roles
from evosteer_core.paradigms.runner import paradigm_context, run_paradigm
from evosteer_core.paradigms.template import TEMPLATE_ROLES

ARTIFACT_KIND = "evosteer.searched_workflows/1"


@dataclass(frozen=True)
class SearchSettings:
    """The search budget: ``candidates`` sampled teams per family on top of the three seed
    teams, each run on ``tasks_per_family`` training records ``runs`` times."""

    candidates: int = 16
    tasks_per_family: int = 16
    runs: int = 1
    max_nodes: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("tasks_per_family", "runs", "max_nodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"search.{name} must be >= 1, got {getattr(self, name)}")
        if self.candidates < 0:
            raise ValueError(f"search.candidates must be >= 0, got {self.candidates}")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, int]) -> SearchSettings:
        """Settings from a partial mapping (missing keys keep their defaults)."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"search: unknown settings {unknown}; known: {sorted(known)}")
        return cls(**data)


@dataclass(frozen=True)
class Candidate:
    """One team of the search space (``base.chain_script``)."""

    roles: tuple[str, ...]
    fan_in: bool = False
    rerun_output: bool = False

    @property
    def name(self) -> str:
        flags = "+fan_in" * self.fan_in + "+rerun" * self.rerun_output
        return ">".join(self.roles) + flags

    def script(self) -> tuple[Action, ...]:
        return chain_script(self.roles, fan_in=self.fan_in, rerun_output=self.rerun_output)


def search_space(view: TaskView, catalogue: Catalogue, max_nodes: int) -> list[Candidate]:
    """Every chain team of the family, in a fixed order (fewer nodes first)."""
    outputs = [r for r in view.roles if catalogue.role(r).output_ok]
    space: list[Candidate] = []
    for k in range(1, max_nodes + 1):
        for head in itertools.product(view.roles, repeat=k - 1):
            for last in outputs:
                for fan_in in (False, True) if k >= 3 else (False,):
                    for rerun in (False,) if view.interactive else (False, True):
                        space.append(Candidate((*head, last), fan_in, rerun))
    return space


def seed_candidates(view: TaskView) -> list[Candidate]:
    """The direct, template and plan-then-execute teams, where the search starts."""
    return [
        Candidate(("solver",)),
        Candidate(TEMPLATE_ROLES, fan_in=True),
        Candidate(planned_roles(view)),
    ]


def candidate_pool(
    view: TaskView, catalogue: Catalogue, settings: SearchSettings
) -> list[Candidate]:
    """The seed teams, then ``settings.candidates`` others drawn from the space (seeded by
    the search seed and the family)."""
    seeds = list(dict.fromkeys(seed_candidates(view)))
    rest = [c for c in search_space(view, catalogue, settings.max_nodes) if c not in seeds]
    rng = random.Random(derive_seed(settings.seed, "paradigm-search", view.family))
    return seeds + rng.sample(rest, min(settings.candidates, len(rest)))


def search_workflows(
    cfg: RunConfig, train_records: Sequence[TaskRecord], settings: SearchSettings | None = None
) -> dict[str, Any]:
    """The best team per family of ``train_records`` (JSON-able; docs/paradigms.md)."""
    settings = settings or SearchSettings()
    records = list(train_records)
    world = world_for(cfg, records, [])
    families: dict[str, Any] = {}
    for family in FAMILIES:
        tasks = [r for r in records if r.family == family][: settings.tasks_per_family]
        if not tasks:
            continue
        view = view_of(tasks[0], world.catalogue)
        pool = candidate_pool(view, world.catalogue, settings)
        scores = {c.name: _score(cfg, world, c, tasks, settings) for c in pool}
        order = {c.name: i for i, c in enumerate(pool)}
        best = min(pool, key=lambda c: (-scores[c.name][0], scores[c.name][1], order[c.name]))
        families[family] = {
            "workflow": best.name,
            "roles": list(best.roles),
            "fan_in": best.fan_in,
            "rerun_output": best.rerun_output,
            "actions": [a.to_json() for a in best.script()],
            "train_reward": scores[best.name][0],
            "train_tokens": scores[best.name][1],
            "tasks": len(tasks),
            "scores": {name: list(s) for name, s in scores.items()},
        }
    if not families:
        raise ValueError("workflow search: no training records were given")
    return {"kind": ARTIFACT_KIND, "settings": settings.to_dict(), "families": families}


def _score(
    cfg: RunConfig,
    world: World,
    candidate: Candidate,
    tasks: list[TaskRecord],
    settings: SearchSettings,
) -> tuple[float, float]:
    """(mean training reward, mean tokens) of one team over ``tasks`` × ``settings.runs``."""
    script = candidate.script()
    paradigm = ScriptedParadigm(candidate.name, lambda view: script)
    plans = [EpisodePlan(t, "rho", 0, evaluation=True) for t in tasks]
    rewards: list[float] = []
    tokens: list[int] = []
    for run in range(settings.runs):
        seed = derive_seed(cfg.train.seed, "paradigm-search", settings.seed, run)
        ctx = paradigm_context(cfg, world, seed, world.train_evaluator)
        for ep in run_paradigm(paradigm, plans, ctx):
            rewards.append(float(ep.reward or 0.0))
            tokens.append(ep.ledger.tokens)
    return sum(rewards) / len(rewards), sum(tokens) / len(tokens)


def search_run_workflows(cfg: RunConfig, settings: SearchSettings) -> dict[str, Any]:
    """:func:`search_workflows` on the run's training records (``load_records(cfg)[0]``; the
    held-out ones are never passed on)."""
    return search_workflows(cfg, load_records(cfg)[0], settings)


def store_workflows(store: ArtifactStore, workflows: Mapping[str, Any]) -> ArtifactRef:
    """The search result as canonical JSON in the store (equal results, equal refs)."""
    return put_json(store, dict(workflows), "searched_workflows.json")


def searched_paradigm(workflows: Mapping[str, Any]) -> ScriptedParadigm:
    """The frozen searched workflow as a paradigm: each family runs its stored script."""
    if workflows.get("kind") != ARTIFACT_KIND:
        raise ValueError(
            f"not a searched-workflow artifact: kind {workflows.get('kind')!r}, "
            f"expected {ARTIFACT_KIND!r}"
        )
    scripts = {
        family: tuple(Action.from_json(a) for a in entry["actions"])
        for family, entry in workflows["families"].items()
    }

    def planner(view: TaskView) -> tuple[Action, ...]:
        if view.family not in scripts:
            raise ValueError(
                f"the searched workflows have no team for family {view.family!r} "
                f"(searched on {sorted(scripts)}): search on training tasks of that family"
            )
        return scripts[view.family]

    return ScriptedParadigm("searched", planner)
