"""What every task receives and returns: the run spec and the artifact-ref bundles.

Inputs and outputs are dataclasses of plain fields. Payloads never travel inline: tasks exchange
:class:`~evosteer_core.infra.artifacts.ArtifactRef` values pointing into the content-addressed store,
so a cache hit can never point at a deleted flytekit temp file; one that points at an object
deleted from the store is caught by :func:`require_stored`.
"""

import threading
from dataclasses import dataclass

from evosteer_core.episode.world import stage_data
from evosteer_core.infra.artifacts import (
    ArtifactRef,
    ArtifactStore,
    MissingArtifactError,
    missing_refs,
    open_store,
    store_id,
)
from evosteer_core.infra.config import RunConfig, config_from_dict
from evosteer_core.infra.configio import parse_yaml
from evosteer_core.infra.memo import BoundedMemo
from evosteer_core.infra.redact import redact_url
from evosteer_core.infra.runs import config_hash, run_id_for
from evosteer_core.pipeline.stage_io import StepStore


@dataclass
class RunSpec:
    """Identity of a run as the cache sees it.

    ``config_hash`` covers everything a step computes (``runs.config_hash``: no operational
    keys, no ``train.steps``); ``store_id`` is the store's identity (``artifacts.store_id``),
    not its location: cached refs are only good in the store they were written to, and a
    moved store folder or another endpoint of the same bucket is still that store, while
    another clone's ``runs`` folder is not. The config text travels beside the spec as an input
    the cache ignores (its hash is here; it also says where the store is), so extending a
    run's steps keeps the keys of the steps already done.
    """

    run_id: str
    config_hash: str
    seed: int
    store_id: str


def make_spec(cfg: RunConfig) -> RunSpec:
    """The spec of ``cfg``'s run in its store (which gets its id now if it has none)."""
    return RunSpec(
        run_id=run_id_for(cfg),
        config_hash=config_hash(cfg),
        seed=cfg.train.seed,
        store_id=store_id(open_store(cfg.store.root, cfg.store.s3_endpoint)),
    )


def train_config(config_yaml: str, steps: int) -> RunConfig:
    """The config a train workflow runs: ``config_yaml`` with ``steps`` (0 = its
    ``train.steps``) and its benchmark files staged (``world.stage_data``: the run id holds
    their tables' hashes)."""
    source = "<config_yaml>"
    overrides = {"train.steps": steps} if steps else None
    return stage_data(config_from_dict(parse_yaml(config_yaml, source), source, overrides))


class SpecMismatchError(ValueError):
    """The config a task was given is not the one its run spec (its cache key) was made of."""


PARSED_CONFIGS: BoundedMemo[str, tuple[RunConfig, str]] = BoundedMemo(16)
"""Each config text's config and hash, parsed once a process (:func:`parsed_config`)."""

_PARSED_LOCK = threading.Lock()


def parsed_config(config_yaml: str) -> tuple[RunConfig, str]:
    """The config a task's ``config_yaml`` holds and its hash (``runs.config_hash``), parsed
    once a process: every task of a run gets the same text, and a parse took ~5.6 ms, 7 tasks
    a step (docs/performance.md). The config is frozen, so tasks may share it."""

    def parse() -> tuple[RunConfig, str]:
        cfg = config_from_dict(parse_yaml(config_yaml, "<config_yaml>"), "<config_yaml>")
        return cfg, config_hash(cfg)

    with _PARSED_LOCK:
        return PARSED_CONFIGS.get(config_yaml, parse)


def load(spec: RunSpec, config_yaml: str) -> tuple[RunConfig, StepStore]:
    """The config and the run's store, both checked against the spec: the config must hash to
    the spec's hash and its store must be the spec's store (else the cache key and the work
    would describe different runs); a warm start's weights must be in that store."""
    cfg, digest = parsed_config(config_yaml)
    if digest != spec.config_hash:
        raise SpecMismatchError(
            f"config_yaml hashes to {digest}, the run spec says {spec.config_hash}"
        )
    store = open_store(cfg.store.root, cfg.store.s3_endpoint)
    found = store_id(store)
    if found != spec.store_id:
        raise SpecMismatchError(
            f"store {redact_url(store.root)} has id {found}, the run spec says "
            f"{spec.store_id}: config_yaml names another store than the run was keyed on"
        )
    if cfg.policy.init is not None and cfg.policy.init.ref is not None:
        require_stored(store, {"policy.init.ref": cfg.policy.init.ref}, "warm start")
    return cfg, StepStore(store)


class StaleCacheError(MissingArtifactError):
    """A (cached) result points at objects its store no longer holds."""


def require_stored(store: ArtifactStore, refs: dict[str, ArtifactRef], where: str) -> None:
    """Fail in one line, saying what to do, when an artifact ``refs`` names is not in
    ``store``. flytekit cannot be told from inside a task to recompute a cache hit, so the
    tasks that receive refs check them here: the record tasks (what the stage tasks returned,
    hit or not) and every task before it reads its inputs."""
    missing = missing_refs(store, refs)
    if missing:
        shown = ", ".join(f"{n!r} ({refs[n].sha256[:12]})" for n in missing)
        raise StaleCacheError(
            f"{where}: {shown} not in the store {redact_url(store.root)}: a cached result "
            "points at objects deleted from this store; clear the Flyte cache (locally "
            "`pyflyte local-cache clear`, on a cluster re-run with overwrite-cache) or train "
            "into a fresh store (--run-dir)"
        )
