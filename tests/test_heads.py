"""Heads: shapes, seeded init, b_ψ starting at zero, and fits that actually learn."""

from __future__ import annotations

import pytest
import torch

from evosteer_core.infra.seeding import derive_seed, torch_generator
from evosteer_core.training.heads import (
    FEATURE_DIM,
    FlowCorrection,
    HeadFitConfig,
    OutcomeHeads,
    ValueHead,
    family_onehot,
    fit_outcome_heads,
    fit_value_head,
)

D_H = 16


@pytest.fixture(autouse=True)
def one_torch_thread():
    """These fits are tiny: a second intra-op thread only adds contention on a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def synthetic_states(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features in [0,1], families, and a target the head can learn: sigmoid(4 f_0 − 2 + 0.5 k)."""
    gen = torch.Generator().manual_seed(seed)
    features = torch.rand(n, FEATURE_DIM, generator=gen)
    family = torch.randint(0, 6, (n,), generator=gen)
    target = torch.sigmoid(4 * features[:, 0] - 2 + 0.5 * (family.float() - 2.5))
    return features, family, target


def test_family_onehot_and_its_errors() -> None:
    onehot = family_onehot(torch.tensor([0, 5, 2]))
    assert onehot.tolist()[1] == [0, 0, 0, 0, 0, 1]
    with pytest.raises(ValueError, match="value 6 outside 0..5"):
        family_onehot(torch.tensor([1, 6]))


def test_value_head_shape_range_and_seeded_init() -> None:
    features, family, _ = synthetic_states(10, 0)
    rng_before = torch.random.get_rng_state()
    head = ValueHead(seed=derive_seed(42, "value_head"))
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # global RNG untouched
    out = head(features, family)
    assert out.shape == (10,) and torch.all((out > 0) & (out < 1))
    same = ValueHead(seed=derive_seed(42, "value_head"))
    other = ValueHead(seed=derive_seed(43, "value_head"))
    assert all(torch.equal(a, b) for a, b in zip(head.parameters(), same.parameters(), strict=True))
    assert not torch.equal(head.mlp[0].weight, other.mlp[0].weight)
    assert [p.shape for p in head.parameters()] == [(32, 36), (32,), (1, 32), (1,)]
    with pytest.raises(ValueError, match=r"features: expected shape \[N, 30\]"):
        head(features[:, :29], family)


def test_flow_correction_is_zero_at_init_and_trainable() -> None:
    gen = torch.Generator().manual_seed(1)
    h, f = torch.randn(12, D_H, generator=gen), torch.rand(12, FEATURE_DIM, generator=gen)
    b_psi = FlowCorrection(hidden_dim=D_H, seed=7)
    out = b_psi(h, f)
    assert out.shape == (12,) and torch.all(out == 0)
    assert b_psi.mlp[0].weight.shape == (128, D_H + FEATURE_DIM)
    assert b_psi.mlp[0].weight.abs().sum() > 0  # only the last layer is zeroed
    out.pow(2).add(out).sum().backward()
    assert b_psi.mlp[2].weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match=r"h: expected shape \[N, 16\]"):
        b_psi(h[:, :8], f)


def test_value_head_fit_lowers_mse() -> None:
    features, family, target = synthetic_states(256, 3)
    head = ValueHead(seed=11)
    with torch.no_grad():
        before = torch.mean((head(features, family) - target) ** 2).item()
    after_default = fit_value_head(head, features, family, target)  # 50 steps, lr 1e-3
    assert after_default < before
    longer = fit_value_head(head, features, family, target, HeadFitConfig(steps=120, lr=2e-2))
    assert longer < 0.25 * before
    with torch.no_grad():
        assert longer == pytest.approx(torch.mean((head(features, family) - target) ** 2).item())


def test_full_batch_fit_is_deterministic_and_minibatches_need_a_generator() -> None:
    features, family, target = synthetic_states(64, 4)
    fits = []
    for _ in range(2):
        head = ValueHead(seed=5)
        fits.append(fit_value_head(head, features, family, target, HeadFitConfig(steps=20)))
    assert fits[0] == fits[1]
    config = HeadFitConfig(steps=20, batch_size=16)
    mini = [
        fit_value_head(
            ValueHead(seed=5), features, family, target, config, torch_generator(1, "vh")
        )
        for _ in range(2)
    ]
    assert mini[0] == mini[1] != fits[0]
    with pytest.raises(ValueError, match="needs a seeded generator"):
        fit_value_head(ValueHead(seed=5), features, family, target, config)


def test_fit_rejects_bad_data() -> None:
    features, family, target = synthetic_states(8, 5)
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 1\]"):
        fit_value_head(ValueHead(seed=1), features, family, target + 1)
    with pytest.raises(ValueError, match="features has 8 rows"):
        fit_value_head(ValueHead(seed=1), features, family[:4], target)
    with pytest.raises(ValueError, match="batch_size"):
        HeadFitConfig(batch_size=0)


def test_outcome_heads_fit_lowers_both_losses() -> None:
    gen = torch.Generator().manual_seed(9)
    h = torch.randn(128, D_H, generator=gen)
    features = torch.rand(128, FEATURE_DIM, generator=gen)
    rewards = (h[:, 0] > 0).float()  # success is readable from the encoder state
    heads = OutcomeHeads(hidden_dim=D_H, seed=3)
    with torch.no_grad():
        bce0, mse0 = heads.losses(h, features, rewards)
    fitted = fit_outcome_heads(heads, h, features, rewards, HeadFitConfig(steps=80, lr=2e-2))
    assert fitted["bce"] < 0.5 * bce0.item() and fitted["mse"] < 0.5 * mse0.item()
