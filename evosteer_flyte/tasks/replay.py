"""The replay task: recompute one recorded step and compare every artifact (never cached)."""

from dataclasses import dataclass

from flytekit import task

from evosteer_core.infra.artifacts import open_store
from evosteer_core.infra.runs import run_config
from evosteer_core.pipeline.replay import replay_step as replay_core
from evosteer_flyte.tasks.errors import infrastructure_is_recoverable
from evosteer_flyte.tasks.resources import GPU_ACCELERATOR, GPU_IMAGE, GPU_RESOURCES, RETRIES


@dataclass
class ReplayResult:
    """Per-artifact verdict lines; ``differing`` names every artifact that is not identical."""

    run_id: str
    step: int
    identical: bool
    lines: list[str]
    differing: list[str]


@task(
    retries=RETRIES,
    container_image=GPU_IMAGE,
    requests=GPU_RESOURCES,
    limits=GPU_RESOURCES,
    accelerator=GPU_ACCELERATOR,
)
@infrastructure_is_recoverable()
def replay_step(store_root: str, s3_endpoint: str, run_id: str, step: int) -> ReplayResult:
    """Recompute ``step`` of ``run_id`` from the recorded inputs in the store at ``store_root``."""
    store = open_store(store_root, s3_endpoint or None)
    report = replay_core(run_config(store, run_id), store, run_id, step)
    return ReplayResult(
        run_id=run_id,
        step=step,
        identical=report.identical,
        lines=[v.line() for v in report.verdicts],
        differing=report.differing,
    )
