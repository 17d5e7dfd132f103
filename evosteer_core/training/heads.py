"""Small learned heads: the reference value head, the flow correction b_ψ, outcome diagnostics.

* :class:`ValueHead` (Eq. 5): v̂(s) = sigmoid(MLP([f(s); onehot(family)])), 30 + 6 inputs,
  hidden width 32, fitted by MSE against terminal rewards of legal reference continuations.
* :class:`FlowCorrection` (b_ψ, Eq. 8): Linear(d_h + 30, 128) → GELU → Linear(128, 1) on
  [h_ρ(s); f(s)], last layer zero-initialised so the flow starts at the measured anchor.
* :class:`OutcomeHeads`: two diagnostic heads on [h_ρ(s); f(s)] (success probability and
  expected score of the trajectory); they never enter the loss of θ or ψ.

Every head is initialised deterministically from an integer seed (use ``derive_seed``) and the
global torch RNG is left untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from evosteer_core.episode.records import FAMILIES

FEATURE_DIM = 30
"""Length of the execution feature vector f(s) (docs/method.md §1.4)."""

N_FAMILIES = len(FAMILIES)
"""Number of task types in the family one-hot."""


def _seeded_init(module: nn.Module, seed: int) -> None:
    """Re-draw every Linear layer of ``module`` (PyTorch's default law) from a seeded generator.

    Default law: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), which is what
    ``nn.Linear.reset_parameters`` produces; drawing it here makes the init a function of the
    seed alone.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, nn.Linear):
                bound = 1.0 / layer.in_features**0.5
                layer.weight.uniform_(-bound, bound, generator=gen)
                if layer.bias is not None:
                    layer.bias.uniform_(-bound, bound, generator=gen)


def _mlp(in_dim: int, hidden: int) -> nn.Sequential:
    """Linear(in_dim, hidden) → GELU → Linear(hidden, 1), built without drawing global RNG."""
    with torch.random.fork_rng(devices=[]):
        return nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Linear(hidden, 1))


def _check_2d(name: str, x: Tensor, width: int) -> None:
    if x.dim() != 2 or x.shape[1] != width:
        raise ValueError(f"{name}: expected shape [N, {width}], got {tuple(x.shape)}")


def family_onehot(family_idx: Tensor) -> Tensor:
    """One-hot [N, 6] float of family indices (positions in ``records.FAMILIES``)."""
    if family_idx.dim() != 1:
        raise ValueError(f"family_idx: expected shape [N], got {tuple(family_idx.shape)}")
    if family_idx.numel() and (family_idx.min() < 0 or family_idx.max() >= N_FAMILIES):
        bad = family_idx[(family_idx < 0) | (family_idx >= N_FAMILIES)][0].item()
        raise ValueError(f"family_idx: value {bad} outside 0..{N_FAMILIES - 1}")
    return nn.functional.one_hot(family_idx.long(), N_FAMILIES).float()


class ValueHead(nn.Module):
    """Reference value head v̂(s) ∈ (0, 1) from features and task type (Eq. 5)."""

    def __init__(self, seed: int, hidden: int = 32) -> None:
        super().__init__()
        self.mlp = _mlp(FEATURE_DIM + N_FAMILIES, hidden)
        _seeded_init(self, seed)

    def forward(self, features: Tensor, family_idx: Tensor) -> Tensor:
        """v̂ for each row: features [N, 30], family_idx [N] → [N]."""
        _check_2d("features", features, FEATURE_DIM)
        x = torch.cat([features.float(), family_onehot(family_idx)], dim=1)
        return torch.sigmoid(self.mlp(x)).squeeze(-1)


class FlowCorrection(nn.Module):
    """b_ψ(h_ρ(s), f(s)): the learned remainder of the log flow; exactly 0 at initialisation."""

    def __init__(self, hidden_dim: int, seed: int, width: int = 128) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.mlp = _mlp(hidden_dim + FEATURE_DIM, width)
        _seeded_init(self, seed)
        with torch.no_grad():
            self.mlp[2].weight.zero_()
            self.mlp[2].bias.zero_()

    def forward(self, h: Tensor, features: Tensor) -> Tensor:
        """b_ψ for each state: h [N, d_h] (detached h_ρ), features [N, 30] → [N]."""
        _check_2d("h", h, self.hidden_dim)
        _check_2d("features", features, FEATURE_DIM)
        return self.mlp(torch.cat([h.float(), features.float()], dim=1)).squeeze(-1)


class OutcomeHeads(nn.Module):
    """Diagnostic heads on [h_ρ(s); f(s)]: P(success) (r ≥ 1/2) and expected score E[r].

    Choice (the paper only says "two larger outcome heads on [h_ρ; f] serve as diagnostics"):
    two independent MLPs of width 128 with sigmoid outputs; ``success`` is trained with binary
    cross-entropy on 1[r ≥ 1/2], ``score`` with MSE on r. They read the encoder state that the
    value head does not see, so comparing their fit with the value head's shows how much the
    prompt encoding adds over the 30 features.
    """

    def __init__(self, hidden_dim: int, seed: int, width: int = 128) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.success = _mlp(hidden_dim + FEATURE_DIM, width)
        self.score = _mlp(hidden_dim + FEATURE_DIM, width)
        _seeded_init(self, seed)

    def forward(self, h: Tensor, features: Tensor) -> tuple[Tensor, Tensor]:
        """(success logit [N], expected score in (0, 1) [N])."""
        _check_2d("h", h, self.hidden_dim)
        _check_2d("features", features, FEATURE_DIM)
        x = torch.cat([h.float(), features.float()], dim=1)
        return self.success(x).squeeze(-1), torch.sigmoid(self.score(x)).squeeze(-1)

    def losses(self, h: Tensor, features: Tensor, rewards: Tensor) -> tuple[Tensor, Tensor]:
        """(BCE of success vs 1[r ≥ 1/2], MSE of score vs r), each a mean over rows."""
        logit, score = self(h, features)
        success = (rewards >= 0.5).float()
        bce = nn.functional.binary_cross_entropy_with_logits(logit, success)
        return bce, nn.functional.mse_loss(score, rewards.float())


@dataclass(frozen=True)
class HeadFitConfig:
    """Optimiser settings shared by the head fits (Table 3: heads lr 1e-3, β1 0.9, clip 1.0).

    ``batch_size=None`` fits full-batch (the default: the replay window is a few thousand
    states, and full-batch steps are deterministic without any generator); an integer draws
    seeded minibatches without replacement from a permutation per epoch.
    """

    steps: int = 50
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"HeadFitConfig.steps: expected >= 0, got {self.steps}")
        if self.lr <= 0:
            raise ValueError(f"HeadFitConfig.lr: expected > 0, got {self.lr}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"HeadFitConfig.batch_size: expected >= 1, got {self.batch_size}")


def _fit(
    module: nn.Module,
    n_rows: int,
    loss_on: Callable[[Tensor | slice], Tensor],
    config: HeadFitConfig,
    generator: torch.Generator | None,
) -> None:
    """Run ``config.steps`` AdamW steps of ``loss_on(rows)`` on ``module``'s parameters."""
    if config.batch_size is not None and generator is None:
        raise ValueError("minibatch head fit (batch_size set) needs a seeded generator")
    opt = torch.optim.AdamW(
        module.parameters(), lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
    )
    order = torch.empty(0, dtype=torch.long)
    cursor = 0
    for _ in range(config.steps):
        if config.batch_size is None:
            rows: Tensor | slice = slice(None)
        else:
            if cursor >= order.numel():
                order = torch.randperm(n_rows, generator=generator)
                cursor = 0
            rows = order[cursor : cursor + config.batch_size]
            cursor += config.batch_size
        opt.zero_grad(set_to_none=True)
        loss_on(rows).backward()
        nn.utils.clip_grad_norm_(module.parameters(), config.grad_clip)
        opt.step()


def fit_value_head(
    head: ValueHead,
    features: Tensor,
    family_idx: Tensor,
    targets: Tensor,
    config: HeadFitConfig | None = None,
    generator: torch.Generator | None = None,
) -> float:
    """Fit ``head`` in place by MSE to ``targets`` (terminal rewards in [0,1]); return final MSE.

    The returned MSE is over all rows after the last step (no gradient).
    """
    config = config or HeadFitConfig()
    n = features.shape[0]
    if n == 0:
        raise ValueError("fit_value_head: no training states")
    if family_idx.shape != (n,) or targets.shape != (n,):
        raise ValueError(
            f"fit_value_head: features has {n} rows but family_idx {tuple(family_idx.shape)}, "
            f"targets {tuple(targets.shape)}"
        )
    if targets.min() < 0 or targets.max() > 1:
        raise ValueError("fit_value_head: targets must lie in [0, 1]")
    y = targets.float()
    head.train()
    _fit(
        head,
        n,
        lambda rows: nn.functional.mse_loss(head(features[rows], family_idx[rows]), y[rows]),
        config,
        generator,
    )
    head.eval()
    with torch.no_grad():
        return float(nn.functional.mse_loss(head(features, family_idx), y))


def fit_outcome_heads(
    heads: OutcomeHeads,
    h: Tensor,
    features: Tensor,
    rewards: Tensor,
    config: HeadFitConfig | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Fit both outcome heads in place (sum of their losses); return final ``bce`` and ``mse``."""
    config = config or HeadFitConfig()
    n = h.shape[0]
    if n == 0:
        raise ValueError("fit_outcome_heads: no training states")
    if features.shape[0] != n or rewards.shape != (n,):
        raise ValueError(
            f"fit_outcome_heads: h has {n} rows but features {tuple(features.shape)}, "
            f"rewards {tuple(rewards.shape)}"
        )
    if rewards.min() < 0 or rewards.max() > 1:
        raise ValueError("fit_outcome_heads: rewards must lie in [0, 1]")
    heads.train()
    _fit(
        heads,
        n,
        lambda rows: sum(heads.losses(h[rows], features[rows], rewards[rows])),
        config,
        generator,
    )
    heads.eval()
    with torch.no_grad():
        bce, mse = heads.losses(h, features, rewards)
    return {"bce": float(bce), "mse": float(mse)}
