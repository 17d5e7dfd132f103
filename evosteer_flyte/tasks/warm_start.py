"""The warm-start task: fit and store the reference prior of ``policy.init`` (docs/warm_start.md).

A GPU task like the policy's stage passes (``step_tasks.GPU_TASK``), cached on the warm start's
own key (``training.warm_start.warm_start_key``: the policy section, the world's sections but
the held-out split, and the run seed, not the training hyper-parameters) and the store's id, so runs that differ only in how they train share one fit. The config text is
an ignored input; the task checks that it hashes to the key and names the keyed store.
"""

from flytekit import task

from evosteer_core.infra.artifacts import ArtifactRef, open_store, store_id
from evosteer_core.infra.config import config_from_dict
from evosteer_core.infra.configio import parse_yaml
from evosteer_core.infra.redact import redact_url
from evosteer_core.training.warm_start import store_warm_start, warm_start_key
from evosteer_flyte.tasks.errors import infrastructure_is_recoverable
from evosteer_flyte.tasks.spec import SpecMismatchError
from evosteer_flyte.tasks.step_tasks import GPU_TASK


@task(**GPU_TASK)
@infrastructure_is_recoverable()
def warm_start(key: str, store: str, config_yaml: str) -> ArtifactRef:
    """The warm-started backbone's weights in the run's store (``store``: its id)."""
    cfg = config_from_dict(parse_yaml(config_yaml, "<config_yaml>"), "<config_yaml>")
    if warm_start_key(cfg) != key:
        raise SpecMismatchError(
            f"config_yaml gives warm-start key {warm_start_key(cfg)}, the task was keyed {key}"
        )
    opened = open_store(cfg.store.root, cfg.store.s3_endpoint)
    if store_id(opened) != store:
        raise SpecMismatchError(
            f"store {redact_url(opened.root)} has id {store_id(opened)}, the warm-start task "
            f"was keyed on {store}"
        )
    ref, _ = store_warm_start(cfg, opened)
    return ref
