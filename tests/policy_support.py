"""A policy whose θ differs from ρ, for tests of sampling and scoring."""

from __future__ import annotations

import torch

from evosteer_core.policy.backbone import Policy


def perturb_adapter(policy: Policy, seed: int, scale: float = 0.5) -> Policy:
    """Draw every LoRA B matrix from N(0, scale²) with a generator on ``seed`` (B starts at 0,
    so θ = ρ until it moves); returns ``policy``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(policy.model.named_parameters()):
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
    return policy
