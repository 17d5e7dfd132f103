"""Policy: tiny backbone, LoRA θ/ρ, grammar-masked sampling and scoring, h_ρ (docs/method.md §1.6)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from policy_support import perturb_adapter
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from evosteer_core.infra.config import LoraConfig, PolicyConfig, load_config
from evosteer_core.infra.configio import ConfigError
from evosteer_core.infra.seeding import derive_seed, numpy_rng, torch_generator
from evosteer_core.policy.backbone import Policy, load_policy, resolve_backbone, tiny_model_folder
from evosteer_core.policy.encode import encode_h_rho
from evosteer_core.policy.orchestrator import Orchestrator
from evosteer_core.policy.render import render_compact
from evosteer_core.policy.sampling import sample_actions
from evosteer_core.policy.scoring import score_actions, score_and_encode_rho
from evosteer_core.policy.tokenizer import TokenizationError
from evosteer_core.policy.trie import ActionTrie
from experiments.tilt import trajectory_log_ratios
from experiments.vocabulary import random_legal_set, random_public_state

LORA_R = 8
MAX_PROMPT = 96
"""Short prompts (left-truncated, system text kept) keep these tests fast."""


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("policy-cache"))


def _policy(cache_dir: str, perturbed: bool) -> Policy:
    policy = load_policy(
        PolicyConfig(
            lora=LoraConfig(r=LORA_R, alpha=16),
            renderer="compact",
            context_tokens=MAX_PROMPT + 256,  # the prompt limit: MAX_PROMPT
        ),
        cache_dir=cache_dir,
    )
    return perturb_adapter(policy, 7) if perturbed else policy


@pytest.fixture(scope="module")
def fresh(cache_dir: str) -> Policy:
    return _policy(cache_dir, perturbed=False)


@pytest.fixture(scope="module")
def trained(cache_dir: str) -> Policy:
    """A policy whose adapter is non-zero, so θ differs from ρ."""
    return _policy(cache_dir, perturbed=True)


def _batch(n: int, seed: int) -> tuple[list[str], list[list[str]]]:
    rng = numpy_rng("test-policy", seed)
    states = [random_public_state(rng) for _ in range(n)]
    return [render_compact(s) for s in states], [s["legal_actions"] for s in states]


def _generators(n: int, tag: str) -> list[torch.Generator]:
    return [torch_generator("test-sample", tag, i) for i in range(n)]


def _independent_score(
    policy: Policy, prompt: str, text: str, legal: list[str], adapter: bool
) -> float:
    """ℓ via the peft model's own forward on one unpadded sequence, summing every position."""
    tok = policy.tokenizer
    trie = ActionTrie(legal, tok)
    index = legal.index(text)
    prompt_ids = tok.encode_prompt(prompt)
    ids = torch.tensor([prompt_ids + list(trie.sequences[index])])
    with torch.no_grad(), policy.adapter_context(adapter):
        logits = policy.model(input_ids=ids).logits[0].double()
    total = 0.0
    for j, (token, allowed) in enumerate(
        zip(trie.sequences[index], trie.path_allowed(index), strict=True)
    ):
        row = logits[len(prompt_ids) - 1 + j, list(allowed)]
        total += float(torch.log_softmax(row, 0)[allowed.index(token)])
    return total


def test_sampled_actions_are_legal_and_logp_matches_scoring(trained: Policy) -> None:
    prompts, legal = _batch(24, 0)
    legal[3] = legal[3][:1]  # a decision with a single legal action
    out = sample_actions(trained, prompts, legal, _generators(24, "a"))
    for sample, actions in zip(out, legal, strict=True):
        assert sample.text in actions and actions[sample.index] == sample.text
        assert len(sample.allowed) == len(sample.token_ids)
        assert all(t in a for t, a in zip(sample.token_ids, sample.allowed, strict=True))
    assert out[3].logp == 0.0
    scored = score_actions(trained, prompts, [s.text for s in out], legal, True, False)
    assert torch.allclose(scored, torch.tensor([s.logp for s in out]), atol=1e-5)


def test_sampling_is_reproducible_bitwise(trained: Policy) -> None:
    prompts, legal = _batch(16, 1)
    first = sample_actions(trained, prompts, legal, _generators(16, "b"))
    second = sample_actions(trained, prompts, legal, _generators(16, "b"))
    assert first == second
    other = sample_actions(trained, prompts, legal, _generators(16, "c"))
    assert [s.text for s in other] != [s.text for s in first]


def test_sampling_follows_the_restricted_distribution(trained: Policy) -> None:
    prompt, legal = _batch(1, 2)
    legal = [legal[0][:4]]
    n = 300
    out = sample_actions(trained, prompt * n, legal * n, _generators(n, "freq"))
    counts = np.bincount([s.index for s in out], minlength=4) / n
    probs = score_actions(trained, prompt * 4, legal[0], legal * 4, True, False).exp().numpy()
    assert np.abs(counts - probs).max() < 4 * math.sqrt(0.25 / n)


def test_score_matches_independent_forward_and_forced_positions_add_zero(trained: Policy) -> None:
    prompts, legal = _batch(6, 3)
    rng = numpy_rng("test-score-pick")
    texts = [str(rng.choice(actions)) for actions in legal]
    for adapter in (True, False):
        scores = score_actions(trained, prompts, texts, legal, adapter, False)
        for i in range(6):
            expected = _independent_score(trained, prompts[i], texts[i], legal[i], adapter)
            assert scores[i].item() == pytest.approx(expected, abs=1e-4)
    single = score_actions(trained, prompts[:1], legal[0][:1], [legal[0][:1]], True, False)
    assert single.item() == 0.0


def test_probabilities_of_all_legal_actions_sum_to_one(trained: Policy) -> None:
    prompt, legal = _batch(1, 4)
    actions = legal[0]
    scores = score_actions(
        trained, prompt * len(actions), actions, [actions] * len(actions), True, False
    )
    assert scores.double().exp().sum().item() == pytest.approx(1.0, abs=1e-5)


def test_theta_equals_rho_at_initialization(fresh: Policy, trained: Policy) -> None:
    prompts, legal = _batch(8, 5)
    texts = [a[len(a) // 2] for a in legal]
    theta = score_actions(fresh, prompts, texts, legal, True, False)
    rho = score_actions(fresh, prompts, texts, legal, False, False)
    assert torch.equal(theta, rho)
    assert not torch.equal(
        score_actions(trained, prompts, texts, legal, True, False),
        score_actions(trained, prompts, texts, legal, False, False),
    )
    assert torch.equal(rho, score_actions(trained, prompts, texts, legal, False, False))


def test_gradients_reach_lora_parameters_only_when_requested(trained: Policy) -> None:
    prompts, legal = _batch(4, 6)
    texts = [a[0] for a in legal]
    trained.model.zero_grad(set_to_none=True)
    assert not score_actions(trained, prompts, texts, legal, True, False).requires_grad
    loss = -score_actions(trained, prompts, texts, legal, True, True).sum()
    loss.backward()
    for name, param in trained.model.named_parameters():
        if "lora_" in name:
            assert param.grad is not None and param.grad.abs().sum() > 0, name
        else:
            assert not param.requires_grad and param.grad is None, name
    trained.model.zero_grad(set_to_none=True)


def test_h_rho_is_rms_normalized_reference_state(trained: Policy, fresh: Policy) -> None:
    prompts, _ = _batch(5, 7)
    h = encode_h_rho(trained, prompts, batch_size=2)
    assert h.shape == (5, 128) and not h.requires_grad
    assert torch.allclose(h.pow(2).mean(dim=1), torch.ones(5), atol=1e-3)
    assert torch.allclose(h, encode_h_rho(fresh, prompts), atol=1e-5)
    ids = torch.tensor([trained.tokenizer.encode_prompt(prompts[0])])
    with torch.no_grad(), trained.reference():
        last = trained.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, -1]
    expected = last / torch.sqrt(last.pow(2).mean() + 1e-6)
    assert torch.allclose(h[0], expected, atol=1e-5)


def test_adapter_state_round_trips_deterministically(cache_dir: str, trained: Policy) -> None:
    data = trained.adapter_bytes()
    assert data == trained.adapter_bytes()
    other = _policy(cache_dir, perturbed=False)
    other.load_adapter_bytes(data)
    assert other.adapter_bytes() == data
    prompts, legal = _batch(3, 8)
    texts = [a[-1] for a in legal]
    assert torch.equal(
        score_actions(other, prompts, texts, legal, True, False),
        score_actions(trained, prompts, texts, legal, True, False),
    )
    with pytest.raises(ValueError, match="adapter state mismatch"):
        other.load_adapter_state_dict({"nope": torch.zeros(1)})


def test_tiny_folder_is_deterministic_and_reloads(tmp_path, cache_dir: str) -> None:
    first = tiny_model_folder(tmp_path / "a", seed=3)
    second = tiny_model_folder(tmp_path / "b", seed=3)
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
    third = tiny_model_folder(tmp_path / "c", seed=4)
    a, c = load_file(first / "model.safetensors"), load_file(third / "model.safetensors")
    assert any(not torch.equal(a[k], c[k]) for k in a)
    assert tiny_model_folder(tmp_path / "a", seed=3) == first
    model = AutoModelForCausalLM.from_pretrained(first)
    tokenizer = AutoTokenizer.from_pretrained(first)
    assert tokenizer.eos_token_id is not None and model.config.vocab_size == len(tokenizer)
    for name, tensor in model.state_dict().items():
        key = name if name in a else None
        if key:
            assert torch.equal(tensor, a[key]), name


def test_backbones_are_built_in_the_cache_the_server_and_games_use(tmp_path, monkeypatch) -> None:
    """Before: the policy's backbones went to ``$EVOSTEER_CACHE_DIR`` while the managed server's
    SmolLM2 and the generated games went to ``$EVOSTEER_CACHE``, so setting one converted
    SmolLM2 twice (two folders of the same model). Now one variable names one cache."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EVOSTEER_CACHE", str(tmp_path / "cache"))
    folder = resolve_backbone(PolicyConfig(backbone="tiny"), seed=3)
    assert folder == str(tiny_model_folder(tmp_path / "cache" / "models", seed=3))
    assert not (tmp_path / "home").exists()


def test_prompt_truncation_keeps_system_text(fresh: Policy) -> None:
    tok = fresh.tokenizer
    system = "System rules here.\n\n"
    body = " ".join(f"word{i}" for i in range(3000))
    ids = tok.encode_prompt(system + body)
    assert len(ids) == tok.max_prompt_tokens
    system_ids = tok.hf.encode(system, add_special_tokens=False)
    assert ids[: len(system_ids)] == system_ids
    assert tok.hf.decode(ids[len(system_ids) :]).endswith("word2999")


def test_policy_renders_with_its_configured_renderer(fresh: Policy) -> None:
    state = random_public_state(numpy_rng("test-policy-render"))
    assert fresh.render(state) == render_compact(state)


@pytest.mark.slow
def test_smollm2_backbone_samples_and_scores(cache_dir: str) -> None:
    pytest.importorskip("gguf")
    policy = load_policy(
        PolicyConfig(backbone="smollm2", lora=LoraConfig(r=4, alpha=8), context_tokens=64 + 256),
        cache_dir=cache_dir,
    )
    prompts, legal = _batch(2, 10)
    out = sample_actions(policy, prompts, legal, _generators(2, "smol"))
    assert all(s.text in a for s, a in zip(out, legal, strict=True))
    theta = score_actions(policy, prompts, [s.text for s in out], legal, True, False)
    assert torch.allclose(theta, torch.tensor([s.logp for s in out]), atol=1e-4)
    assert torch.equal(
        theta, score_actions(policy, prompts, [s.text for s in out], legal, False, False)
    )


def test_config_errors_name_the_field() -> None:
    for key, value in [
        ("policy.dtype", "float8"),
        ("policy.renderer", "fancy"),
        ("policy.lora.r", 0),
        ("policy.max_action_tokens", 1),
        ("policy.backbone", ""),
    ]:
        with pytest.raises(ConfigError, match=key.rsplit(".", 1)[-1]):
            load_config(None, overrides={key: value})


def test_legal_sets_tokenize_and_round_trip(fresh: Policy) -> None:
    rng = numpy_rng("test-vocab", derive_seed(9))
    for _ in range(50):
        for text in random_legal_set(rng):
            ids = fresh.tokenizer.encode_action(text)
            assert ids[-1] == fresh.tokenizer.eos_id
            assert fresh.tokenizer.hf.decode(list(ids[:-1])) == text
    with pytest.raises(TokenizationError, match="EOS"):
        fresh.tokenizer.encode_action('{"kind":"STOP"}<|endoftext|>')


def test_one_rho_pass_gives_the_same_scores_and_encodings(trained: Policy) -> None:
    """score_and_encode_rho == score_actions(ρ) and encode_h_rho, forced-only decisions too."""
    prompts, legal = _batch(12, 5)
    texts = [acts[len(acts) // 2] for acts in legal]
    texts[0], legal[0] = legal[0][0], legal[0][:1]  # a decision with one legal action
    scores, h = score_and_encode_rho(trained, prompts, texts, legal)
    torch.testing.assert_close(scores, score_actions(trained, prompts, texts, legal, False, False))
    torch.testing.assert_close(h, encode_h_rho(trained, prompts))
    assert scores[0].item() == 0.0


def test_shared_prompt_heads_give_the_unshared_scores_encodings_and_gradients(
    trained: Policy,
) -> None:
    """Decisions that share a prompt run its prefix once (a repeated KV cache); batch size 1
    runs every decision alone, without sharing: values and LoRA gradients agree."""
    prompts, legal = _batch(3, 13)
    rows = [(i, k) for i in range(3) for k in range(4)]  # 4 decisions per prompt
    ps = [prompts[i] for i, _ in rows]
    ls = [legal[i] for i, _ in rows]
    texts = [legal[i][k % len(legal[i])] for i, k in rows]

    def run(batch_size: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        scores, h = score_and_encode_rho(trained, ps, texts, ls, batch_size=batch_size)
        trained.model.zero_grad(set_to_none=True)
        theta = score_actions(trained, ps, texts, ls, True, True, batch_size=batch_size)
        (theta * torch.linspace(0.5, 1.5, len(ps))).sum().backward()
        grads = [p.grad.clone() for p in trained.lora_parameters()]
        trained.model.zero_grad(set_to_none=True)
        return torch.cat([scores, theta.detach()]), h, grads

    shared, alone = run(64), run(1)
    torch.testing.assert_close(shared[0], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared[1], alone[1], atol=1e-5, rtol=1e-5)
    for g_shared, g_alone in zip(shared[2], alone[2], strict=True):
        # float32 rounding of other batch shapes: within 1e-5 of the tensor's largest entry
        # (an absolute 1e-5 failed on an Intel Xeon: 1.2e-5 in a tensor whose largest entry is
        # ~15; every difference there is <= 1.1e-6 of it), as in tests/test_read_positions.py
        scale = float(g_alone.abs().max())
        assert scale > 0
        torch.testing.assert_close(g_shared, g_alone, atol=1e-5 * scale, rtol=0)


def test_trajectory_log_ratios_sum_delta_ell_and_are_zero_at_init(
    fresh: Policy, trained: Policy
) -> None:
    prompts, legal = _batch(6, 11)
    texts = [acts[-1] for acts in legal]
    decisions = pd.DataFrame(
        {
            "traj_id": ["a", "a", "b", "b", "b", "c"],
            "prompt": prompts,
            "action": texts,
            "legal": legal,
        }
    )
    assert (trajectory_log_ratios(Orchestrator(fresh), decisions) == 0.0).all()
    ratios = trajectory_log_ratios(Orchestrator(trained), decisions)
    delta = (
        score_actions(trained, prompts, texts, legal, True, False)
        - score_actions(trained, prompts, texts, legal, False, False)
    ).double()
    assert list(ratios.index) == ["a", "b", "c"]
    np.testing.assert_allclose(
        ratios.to_numpy(), [delta[:2].sum(), delta[2:5].sum(), delta[5]], rtol=1e-6, atol=1e-6
    )


def test_sampling_runs_shared_prompt_heads_once_and_samples_as_alone(
    trained: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decisions that share a prompt head run it once (one KV cache row per decision, padded
    heads masked): the same draws, ℓ and last-prompt hidden states as each decision sampled
    alone (no sharing), with fewer tokens through the backbone."""
    prompts, legal = _batch(4, 21)
    ps = [prompts[i % 4] for i in range(12)]  # 3 decisions per prompt, prompts interleaved
    ls = [legal[i % 4] for i in range(12)]
    fed: list[int] = []
    hidden = trained.hidden

    def counting(ids, *args, **kwargs):
        fed.append(ids.numel())
        return hidden(ids, *args, **kwargs)

    monkeypatch.setattr(trained, "hidden", counting)
    with torch.no_grad(), trained.adapter_context(False):
        together = sample_actions(trained, ps, ls, _generators(12, "h"), return_hidden=True)
        fed_together, fed[:] = sum(fed), []
        alone = [
            sample_actions(trained, [p], [leg], [g], return_hidden=True)[0]
            for p, leg, g in zip(ps, ls, _generators(12, "h"), strict=True)
        ]
    assert fed_together < sum(fed)
    assert [s.index for s in together] == [s.index for s in alone]
    for a, b in zip(together, alone, strict=True):
        assert abs(a.logp - b.logp) < 1e-5
        torch.testing.assert_close(a.hidden, b.hidden, atol=1e-5, rtol=1e-5)
    h = encode_h_rho(trained, ps)
    got = torch.stack([s.hidden for s in together])
    torch.testing.assert_close(
        got * torch.rsqrt(got.pow(2).mean(1, keepdim=True) + 1e-6), h, atol=1e-5, rtol=1e-5
    )
