"""Where each task runs on a cluster: image, resources, accelerator, retries, cache version.

Images are full references, ``<registry>/<repository>:<version>-<code hash>``
(:mod:`evosteer_flyte.images`: from ``containers/images.yaml`` in a checkout, from the image's own
environment in a pod), so registering needs no ``--image`` flags and new code never runs in an
image built from older code. An installed package without its repository falls back to the
templates ``{{.image.cpu}}``/``{{.image.train_gpu}}``, which ``pyflyte register --image
cpu=… --image train_gpu=…`` resolves. GPU tasks (rollout, rescore, AnchorTB update) ask for one
GPU and an accelerator class; statistics, validation and checkpoints run on CPU pods. Local runs
ignore all of this.
"""

from flytekit import Resources
from flytekit.extras.accelerators import H100

# the tasks' cache versions: bump ``evosteer_core/infra/provenance.py:CODE_VERSION`` (every
# task) or ``EVALUATION_VERSION`` (the evaluation tasks alone)
from evosteer_core.infra.provenance import CACHE_VERSION as CACHE_VERSION
from evosteer_core.infra.provenance import EVALUATION_CACHE_VERSION as EVALUATION_CACHE_VERSION
from evosteer_flyte.images import task_images

RETRIES = 3
"""Retries for infrastructure failures (pod eviction, node loss); a user error fails at once."""

_IMAGES = task_images() or {"cpu": "{{.image.cpu}}", "train_gpu": "{{.image.train_gpu}}"}
CPU_IMAGE = _IMAGES["cpu"]
GPU_IMAGE = _IMAGES["train_gpu"]

GPU_ACCELERATOR = H100
GPU_RESOURCES = Resources(cpu="8", mem="64Gi", gpu="1", ephemeral_storage="50Gi")
CPU_RESOURCES = Resources(cpu="2", mem="8Gi")
LIGHT_RESOURCES = Resources(cpu="1", mem="2Gi")

ROLLOUT_SHARDS_REMOTE = 4
"""Record shards a remote rollout fans out over (``map_task``); local runs use one."""
