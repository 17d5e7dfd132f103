"""What a cluster launches: one ``@workflow`` per pipeline and named launch plans.

``train``, ``evaluate`` and ``experiment`` wrap the ``@dynamic`` tasks of ``train.py``,
``evaluate.py`` and ``experiment.py`` (the experiment plan's default config only when the
launch config has an ``experiment`` section);
``replay`` is the workflow of ``replay.py``. Each gets a launch plan whose defaults come from
one config file, :data:`LAUNCH_CONFIG` (``configs/paper.yaml``, or ``$EVOSTEER_LAUNCH_CONFIG``
at registration): its text is the default ``config_yaml``, its store and run id are the
replay's defaults. ``<name>.train.weekly`` is the train plan on a cron schedule, registered
inactive (``pyflyte launchplan --activate`` starts it); as every stage task is cached, a firing
resumes a crashed or extended run and costs only cache look-ups once the run is complete.

Only registration imports this module (a task pod imports the module of its task), so reading
the config file here never happens in a pod.

    pyflyte register --project evosteer --domain development evosteer_flyte/workflows/
    pyflyte run --remote evosteer_flyte/workflows/launch.py train_plan --steps 3
"""

import os
from pathlib import Path

from flytekit import CronSchedule, LaunchPlan, workflow

from evosteer_core.evaluation.tables import RUNS
from evosteer_core.infra.artifacts import ArtifactRef
from evosteer_core.infra.config import RunConfig, load_config
from evosteer_core.infra.runs import run_id_for
from evosteer_flyte.tasks.resources import ROLLOUT_SHARDS_REMOTE
from evosteer_flyte.tasks.tracking_tasks import fail_tracking
from evosteer_flyte.workflows import evaluate as evaluate_tasks
from evosteer_flyte.workflows import experiment as experiment_tasks
from evosteer_flyte.workflows import replay as replay_workflow
from evosteer_flyte.workflows import train as train_tasks

LAUNCH_CONFIG_ENV = "EVOSTEER_LAUNCH_CONFIG"
LAUNCH_CONFIG = Path(
    os.environ.get(LAUNCH_CONFIG_ENV) or Path(__file__).resolve().parents[2] / "configs/paper.yaml"
)
"""The config file whose values are the launch plans' defaults."""

TRAIN_SCHEDULE = "0 3 * * 1"
"""Cron of the scheduled train plan: Mondays 03:00 UTC."""


@workflow(on_failure=fail_tracking)
def train(
    config_yaml: str, steps: int = 0, rollout_shards: int = ROLLOUT_SHARDS_REMOTE
) -> train_tasks.TrainOutputs:
    """Train ``steps`` steps (0 = ``train.steps``); rollouts fan out over ``rollout_shards``.
    A failed execution ends its MLflow run FAILED (the failure node, ``fail_tracking``)."""
    return train_tasks.train(config_yaml=config_yaml, steps=steps, rollout_shards=rollout_shards)


@workflow
def evaluate(
    config_yaml: str,
    state: ArtifactRef,
    benchmarks: list[str] = [],  # noqa: B006
    paths: list[str] = [],  # noqa: B006
    runs: int = RUNS,
    rows: list[str] = [],  # noqa: B006
    search: dict[str, int] = {},  # noqa: B006
) -> evaluate_tasks.EvaluateOutputs:
    """A checkpoint × benchmarks × runs (no benchmarks = the six sim families); ``rows``
    compares the checkpoint with other rows (docs/paradigms.md)."""
    return evaluate_tasks.evaluate(
        config_yaml=config_yaml,
        state=state,
        benchmarks=benchmarks,
        paths=paths,
        runs=runs,
        rows=rows,
        search=search,
    )


@workflow
def experiment(config_yaml: str) -> experiment_tasks.ExperimentOutputs:
    """Every (row, seed) cell of the config's ``experiment`` section, then the table."""
    return experiment_tasks.experiment(config_yaml=config_yaml)


replay = replay_workflow.replay


def _launch_config(path: Path) -> tuple[str, RunConfig]:
    """The file's text and its validated config; a missing file says how to choose another."""
    if not path.is_file():
        raise FileNotFoundError(
            f"launch config {path} not found: set {LAUNCH_CONFIG_ENV} to a run config file"
        )
    return path.read_text(), load_config(path)


def launch_plans(path: Path, schedule: str = TRAIN_SCHEDULE) -> dict[str, LaunchPlan]:
    """The named launch plans of the config at ``path`` (names ``<config name>.<pipeline>``)."""
    text, cfg = _launch_config(path)
    store = {"store_root": cfg.store.root, "s3_endpoint": cfg.store.s3_endpoint or ""}
    train_defaults = {"config_yaml": text, "rollout_shards": ROLLOUT_SHARDS_REMOTE}
    plan = LaunchPlan.get_or_create
    return {
        "train": plan(train, name=f"{cfg.name}.train", default_inputs=train_defaults),
        "train_weekly": plan(
            train,
            name=f"{cfg.name}.train.weekly",
            default_inputs=train_defaults,
            schedule=CronSchedule(schedule=schedule),
        ),
        "evaluate": plan(
            evaluate, name=f"{cfg.name}.evaluate", default_inputs={"config_yaml": text}
        ),
        "experiment": plan(
            experiment,
            name=f"{cfg.name}.experiment",
            default_inputs={"config_yaml": text} if cfg.experiment is not None else {},
        ),
        "replay": plan(
            replay, name=f"{cfg.name}.replay", default_inputs={**store, "run_id": run_id_for(cfg)}
        ),
    }


_PLANS = launch_plans(LAUNCH_CONFIG)
train_plan = _PLANS["train"]
train_weekly = _PLANS["train_weekly"]
evaluate_plan = _PLANS["evaluate"]
experiment_plan = _PLANS["experiment"]
replay_plan = _PLANS["replay"]
