"""Where each task runs on a cluster: image, resources, accelerator, retries, cache version.

Images are flytekit image templates (``{{.image.<kind>}}``) resolved at registration from the
config's ``images`` section (:func:`image_config`), so one registration script serves any
config. GPU tasks (rollout, rescore, AnchorTB update) ask for one GPU and an accelerator class;
statistics, validation and checkpoints run on CPU pods. Local runs ignore all of this.
"""

from flytekit import Resources
from flytekit.configuration import Image, ImageConfig
from flytekit.extras.accelerators import H100

import evosteer_core
from evosteer_core.infra.config import RunConfig

CODE_VERSION = "5"
"""Bump when a task's outputs change for the same inputs (flytekit's cache ignores code)."""

CACHE_VERSION = f"{evosteer_core.__version__}-{CODE_VERSION}"

RETRIES = 3
"""Retries for infrastructure failures (pod eviction, node loss); a user error fails at once."""

CPU_IMAGE = "{{.image.cpu}}"
GPU_IMAGE = "{{.image.train_gpu}}"

GPU_ACCELERATOR = H100
GPU_RESOURCES = Resources(cpu="8", mem="64Gi", gpu="1", ephemeral_storage="50Gi")
CPU_RESOURCES = Resources(cpu="2", mem="8Gi")
LIGHT_RESOURCES = Resources(cpu="1", mem="2Gi")

ROLLOUT_SHARDS_REMOTE = 4
"""Record shards a remote rollout fans out over (``map_task``); local runs use one."""


def image_config(cfg: RunConfig) -> ImageConfig:
    """The image references of ``cfg.images`` as flytekit's ImageConfig (``cpu`` = default)."""
    imgs = cfg.images
    named = {"cpu": imgs.cpu, "train_gpu": imgs.train_gpu, "rollout_vllm": imgs.rollout_vllm}
    missing = [k for k in ("cpu", "train_gpu") if not named[k]]
    if missing:
        raise ValueError(
            f"images.{missing[0]}: required to compile for a cluster (see configs/paper.yaml)"
        )
    images = [Image.look_up_image_info(k, v) for k, v in named.items() if v]
    default = next(i for i in images if i.name == "cpu")
    return ImageConfig.create_from(default, images)
