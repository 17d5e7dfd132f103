"""What every task receives and returns: the run spec and the artifact-ref bundles.

Inputs and outputs are dataclasses of plain fields. Payloads never travel inline: tasks exchange
:class:`~evosteer_core.infra.artifacts.ArtifactRef` values pointing into the content-addressed store,
so a cache hit can never point at a deleted flytekit temp file.
"""

from dataclasses import dataclass

from evosteer_core.infra.artifacts import ArtifactStore, open_store
from evosteer_core.infra.config import RunConfig, config_from_dict
from evosteer_core.infra.configio import parse_yaml
from evosteer_core.infra.runs import config_hash, run_id_for
from evosteer_core.pipeline.stage_io import StepStore


@dataclass
class RunSpec:
    """Identity of a run as the cache sees it.

    ``config_hash`` covers everything a step computes (``runs.config_hash``: no
    operational keys, no ``train.steps``); ``store_root`` is in the key because cached refs point
    into that store. The config text itself travels beside the spec as an input the cache
    ignores, so extending a run's steps keeps the keys of the steps already done.
    """

    run_id: str
    config_hash: str
    seed: int
    store_root: str
    s3_endpoint: str = ""


def make_spec(cfg: RunConfig) -> RunSpec:
    return RunSpec(
        run_id=run_id_for(cfg),
        config_hash=config_hash(cfg),
        seed=cfg.train.seed,
        store_root=cfg.store.root,
        s3_endpoint=cfg.store.s3_endpoint or "",
    )


def load(spec: RunSpec, config_yaml: str) -> tuple[RunConfig, StepStore]:
    """The config (checked against the spec's hash) and the run's store."""
    cfg = config_from_dict(parse_yaml(config_yaml, "<config_yaml>"), "<config_yaml>")
    if config_hash(cfg) != spec.config_hash:
        raise ValueError(
            f"config_yaml hashes to {config_hash(cfg)}, the run spec says {spec.config_hash}"
        )
    return cfg, StepStore(store_of(spec))


def store_of(spec: RunSpec) -> ArtifactStore:
    return open_store(spec.store_root, spec.s3_endpoint or None)
