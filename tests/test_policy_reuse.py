"""A backbone kept for reuse is handed out bitwise as a fresh load would give it, and never to
two live policies at once (evosteer_core.policy.backbone.LOADED_BACKBONES)."""

from __future__ import annotations

import gc

import pytest
import torch

from evosteer_core.infra.config import LoraConfig, PolicyConfig
from evosteer_core.policy.backbone import LOADED_BACKBONES, Policy, load_policy
from evosteer_core.policy.scoring import score_actions

CONFIG = PolicyConfig(lora=LoraConfig(r=4, alpha=8), renderer="compact", context_tokens=512)
PROMPTS = ["system\n\nfamily: math\nnodes: n0", "system\n\nfamily: code\nnodes: n0 n1"]
LEGAL = [['{"kind":"STOP"}', '{"kind":"SET_OUTPUT","node_id":"n0"}']] * 2
ACTIONS = ['{"kind":"STOP"}', '{"kind":"SET_OUTPUT","node_id":"n0"}']


@pytest.fixture()
def cache_dir(tmp_path) -> str:
    LOADED_BACKBONES.clear()
    yield str(tmp_path)
    LOADED_BACKBONES.clear()


def _load(cache_dir: str, **kw) -> Policy:
    return load_policy(CONFIG, seed=3, cache_dir=cache_dir, **kw)


def _train_a_little(policy: Policy) -> None:
    """One optimizer step on the adapter (leaves gradients behind, as the update stage does)."""
    opt = torch.optim.SGD(policy.lora_parameters(), lr=0.5)
    loss = -score_actions(policy, PROMPTS, ACTIONS, LEGAL, True, True).sum()
    loss.backward()
    opt.step()


def _scores(policy: Policy) -> list[torch.Tensor]:
    return [score_actions(policy, PROMPTS, ACTIONS, LEGAL, a, False) for a in (True, False)]


def test_a_reused_backbone_is_bitwise_a_fresh_load(cache_dir):
    first = _load(cache_dir)
    model = first.model
    _train_a_little(first)
    del first
    gc.collect()
    reused = _load(cache_dir)
    assert reused.model is model  # handed out again, not loaded
    assert all(p.grad is None for p in reused.model.parameters())
    fresh = _load(cache_dir, reuse=False)
    assert fresh.model is not model
    a, b = reused.adapter_state_dict(), fresh.adapter_state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the same LoRA draw
    assert not reused.model.training
    for x, y in zip(_scores(reused), _scores(fresh), strict=True):
        assert torch.equal(x, y)


def test_a_live_policy_never_shares_its_model(cache_dir):
    first = _load(cache_dir)
    second = _load(cache_dir)
    assert second.model is not first.model
    _train_a_little(first)
    fresh = _load(cache_dir, reuse=False)
    for x, y in zip(_scores(second), _scores(fresh), strict=True):
        assert torch.equal(x, y)


def test_a_changed_backbone_is_loaded_again(cache_dir):
    first = _load(cache_dir)
    model = first.model
    with torch.no_grad():  # an in-place write to a backbone weight (as a merge would do)
        next(p for n, p in model.named_parameters() if "lora_" not in n).add_(1.0)
    del first
    gc.collect()
    assert _load(cache_dir).model is not model
