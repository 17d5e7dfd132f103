"""The orchestrator as the training loop sees it: π_θ / ρ sampling, scoring and h_ρ.

A thin facade over ``policy`` (backbone, trie sampler, scorer, encoder) built from a
``RunConfig``, so that rollouts and updates name one object whatever the backbone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from evosteer_core.infra.artifacts import open_store
from evosteer_core.infra.config import RunConfig
from evosteer_core.policy.backbone import Policy, load_policy
from evosteer_core.policy.encode import rms_normalize
from evosteer_core.policy.sampling import sample_actions
from evosteer_core.policy.scoring import score_actions, score_and_encode_rho


@dataclass(frozen=True)
class Choice:
    """A sampled decision: index into the legal list, ℓ under the sampling policy, token counts."""

    index: int
    logp: float
    prompt_tokens: int
    action_tokens: int
    h: list[float] | None = None
    """With ``encode``: the state encoding under the sampling policy (RMS-normalized last prompt
    hidden state, as ``encode_h_rho`` computes it under ρ); None otherwise."""


class Orchestrator:
    """π_θ (adapter on) and ρ (adapter off) over one backbone."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    @property
    def hidden_size(self) -> int:
        return int(self.policy.model.get_base_model().config.hidden_size)

    @property
    def max_action_tokens(self) -> int:
        """The longest action a decision may generate (its token reservation)."""
        return self.policy.config.max_action_tokens

    def count_tokens(self, prompt: str) -> int:
        return len(self.policy.tokenizer.encode_prompt(prompt))

    def sample(
        self,
        prompts: Sequence[str],
        legal: Sequence[Sequence[str]],
        generators: Sequence[torch.Generator],
        use_adapter: bool,
        temperature: float = 1.0,
        encode: bool = False,
    ) -> list[Choice]:
        with torch.no_grad(), self.policy.adapter_context(use_adapter):
            samples = sample_actions(
                self.policy, prompts, legal, generators, temperature, return_hidden=encode
            )
        return [
            Choice(
                s.index,
                s.logp,
                self.count_tokens(p),
                len(s.token_ids),
                None if s.hidden is None else rms_normalize(s.hidden).tolist(),
            )
            for s, p in zip(samples, prompts, strict=True)
        ]

    def score(
        self,
        prompts: Sequence[str],
        actions: Sequence[str],
        legal: Sequence[Sequence[str]],
        use_adapter: bool,
        requires_grad: bool = False,
    ) -> torch.Tensor:
        return score_actions(self.policy, prompts, actions, legal, use_adapter, requires_grad)

    def score_and_encode_rho(
        self, prompts: Sequence[str], actions: Sequence[str], legal: Sequence[Sequence[str]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ℓ_ρ and h_ρ from one ρ pass (see ``policy.scoring.score_and_encode_rho``)."""
        return score_and_encode_rho(self.policy, prompts, actions, legal)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return self.policy.lora_parameters()

    def adapter_state(self) -> dict[str, torch.Tensor]:
        return self.policy.adapter_state_dict()

    def load_adapter_state(self, state: dict[str, torch.Tensor]) -> None:
        self.policy.load_adapter_state_dict(state)


def build_orchestrator(cfg: RunConfig) -> Orchestrator:
    """Load the configured backbone with a fresh LoRA adapter (LoRA B = 0, so θ = ρ); a
    warm-started backbone (``policy.init``) reads its weights from the run's store."""
    store = None if cfg.policy.init is None else open_store(cfg.store.root, cfg.store.s3_endpoint)
    return Orchestrator(load_policy(cfg.policy, seed=cfg.train.seed, store=store))
