"""The orchestrator's LoRA adapter as a PEFT adapter folder, the format a run hands off.

A train state keeps the adapter as a tensor dict (``TrainState.adapter``, the keys of
``peft.get_peft_model_state_dict``). :func:`adapter_files` writes it as PEFT's own
``save_pretrained`` does, ``adapter_config.json`` plus ``adapter_model.safetensors``, without
loading the backbone, so a light bookkeeping task can export a 9B model's adapter; anyone with
the backbone loads it with ``PeftModel.from_pretrained(base, folder)``. The adapter config's
``base_model_name_or_path`` is ``policy.backbone`` when that is a hub id or a folder, and empty
for an evosteer preset (``tiny``, ``smollm2``: no hub repository, and PEFT looks a non-empty name
up on the hub), whose base :func:`~evosteer_core.policy.backbone.resolve_backbone` builds from
the run's ``policy`` section and seed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from peft import PeftModel
from safetensors.torch import save as save_safetensors

from evosteer_core.infra.config import PolicyConfig
from evosteer_core.policy.backbone import Policy, load_policy, lora_config

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
"""The files of an adapter folder (PEFT's names)."""

BACKBONE_PRESETS = ("tiny", "smollm2")
"""``policy.backbone`` values that name an evosteer-built base, not a hub id or a folder."""


def adapter_files(policy: PolicyConfig, adapter: dict[str, torch.Tensor]) -> dict[str, bytes]:
    """The adapter folder's files (name → bytes) for the adapter tensors of a train state."""
    config = lora_config(policy)
    config.base_model_name_or_path = "" if policy.backbone in BACKBONE_PRESETS else policy.backbone
    config.inference_mode = True
    with tempfile.TemporaryDirectory(prefix="evosteer-adapter-") as tmp:
        config.save_pretrained(tmp)
        config_bytes = (Path(tmp) / ADAPTER_CONFIG).read_bytes()
    tensors = {k: adapter[k].detach().cpu().contiguous() for k in sorted(adapter)}
    weights = save_safetensors(tensors, metadata={"format": "pt"})
    return {ADAPTER_CONFIG: config_bytes, ADAPTER_WEIGHTS: weights}


def save_adapter(policy: PolicyConfig, adapter: dict[str, torch.Tensor], folder: Path) -> Path:
    """Write the adapter folder (:func:`adapter_files`) to ``folder``; the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in adapter_files(policy, adapter).items():
        (folder / name).write_bytes(data)
    return folder


def load_adapter_policy(
    folder: str | Path, policy: PolicyConfig, seed: int, cache_dir: str | None = None
) -> Policy:
    """A :class:`Policy` whose adapter is the PEFT folder ``folder``, loaded with
    ``PeftModel.from_pretrained`` onto the backbone of ``policy`` (drawn from ``seed``)."""
    fresh = load_policy(policy, seed=seed, cache_dir=cache_dir)
    base = fresh.model.unload()  # the backbone without the freshly drawn LoRA layers
    model = PeftModel.from_pretrained(base, str(folder))
    model.eval()
    return Policy(model, fresh.tokenizer, policy)
