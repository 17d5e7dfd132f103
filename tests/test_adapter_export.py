"""The adapter of a train state as a PEFT adapter folder: the bytes PEFT itself would write,
loaded by ``PeftModel.from_pretrained`` onto a fresh backbone with the same outputs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from evosteer_core.infra.config import load_config
from evosteer_core.policy.adapter_export import (
    ADAPTER_CONFIG,
    ADAPTER_FILES,
    ADAPTER_WEIGHTS,
    adapter_files,
    load_adapter_policy,
    lora_config,
    save_adapter,
)
from evosteer_core.policy.backbone import load_policy, resolve_backbone


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny policy whose adapter moved away from its initialization (B ≠ 0, so θ ≠ ρ)."""
    cfg = load_config(None, {"policy.lora.r": 4, "policy.lora.alpha": 8})
    policy = load_policy(cfg.policy, seed=cfg.train.seed)
    gen = torch.Generator().manual_seed(3)
    state = {
        k: v + 0.05 * torch.randn(v.shape, generator=gen)
        for k, v in policy.adapter_state_dict().items()
    }
    policy.load_adapter_state_dict(state)
    return cfg, policy, state


def test_files_are_what_peft_save_pretrained_writes(trained, tmp_path: Path) -> None:
    cfg, policy, state = trained
    policy.model.save_pretrained(tmp_path / "peft")  # PEFT's own writer, the reference
    ours = save_adapter(cfg.policy, state, tmp_path / "ours")
    assert sorted(p.name for p in ours.iterdir()) == sorted(ADAPTER_FILES)
    got, want = load_file(ours / ADAPTER_WEIGHTS), load_file(tmp_path / "peft" / ADAPTER_WEIGHTS)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    ours_cfg = json.loads((ours / ADAPTER_CONFIG).read_text())
    peft_cfg = json.loads((tmp_path / "peft" / ADAPTER_CONFIG).read_text())
    # PEFT writes the local folder it loaded; a preset backbone has no name to write
    assert cfg.policy.backbone == "tiny" and ours_cfg.pop("base_model_name_or_path") == ""
    peft_cfg.pop("base_model_name_or_path")
    assert ours_cfg == peft_cfg
    assert ours_cfg["r"] == 4 and ours_cfg["lora_alpha"] == 8
    assert (
        lora_config(cfg.policy).target_modules == policy.model.peft_config["default"].target_modules
    )
    assert adapter_files(cfg.policy, state) == {n: (ours / n).read_bytes() for n in ADAPTER_FILES}
    hub = replace(cfg.policy, backbone="HuggingFaceTB/SmolLM2-135M-Instruct")
    named = json.loads(adapter_files(hub, state)[ADAPTER_CONFIG])
    assert named["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_peft_from_pretrained_loads_it_with_the_same_outputs(trained, tmp_path: Path) -> None:
    cfg, policy, state = trained
    folder = save_adapter(cfg.policy, state, tmp_path / "adapter")
    base = AutoModelForCausalLM.from_pretrained(resolve_backbone(cfg.policy, cfg.train.seed))
    loaded = PeftModel.from_pretrained(base, str(folder)).eval()
    ids = torch.tensor([[5, 17, 42, 7, 99, 3]])
    with torch.no_grad():
        want = policy.model(input_ids=ids).logits
        got = loaded(input_ids=ids).logits
        with loaded.disable_adapter():
            rho = loaded(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert (got - rho).abs().max() > 1e-3  # the adapter really is applied

    again = load_adapter_policy(folder, cfg.policy, cfg.train.seed)
    assert isinstance(again.model, PeftModel)
    loaded_state = again.adapter_state_dict()
    assert loaded_state.keys() == state.keys()
    assert all(torch.equal(loaded_state[k], state[k]) for k in state)
