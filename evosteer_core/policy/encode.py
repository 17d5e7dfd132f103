"""h_ρ(s): the reference model's state encoding (docs/method.md §1.6)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from evosteer_core.policy.backbone import Policy
from evosteer_core.policy.batch import right_pad

RMS_EPS = 1e-6


def rms_normalize(x: torch.Tensor, eps: float = RMS_EPS) -> torch.Tensor:
    """x · rsqrt(mean(x²) + eps) over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def encode_h_rho(policy: Policy, prompts: Sequence[str], batch_size: int = 64) -> torch.Tensor:
    """Last-layer hidden state at each prompt's final token under ρ, RMS-normalized, detached.

    Returns float32 [B, d_h] on CPU.
    """
    tok = policy.tokenizer
    encoded = [tok.encode_prompt(p) for p in prompts]
    out = []
    with torch.no_grad(), policy.reference():
        for start in range(0, len(encoded), batch_size):
            chunk = encoded[start : start + batch_size]
            ids, mask, pos = right_pad(chunk, tok.pad_id)
            last = torch.tensor([[len(c) - 1] for c in chunk])
            hidden, _ = policy.hidden(ids, mask, pos, read=last)
            out.append(hidden[:, 0].float())
    return rms_normalize(torch.cat(out)).cpu()
