"""The decoder pass with its last layer at the read positions only (``policy.read_positions``)
against the full Hugging Face forward pass of the same model, gathered at those positions.

The independent computation is ``LlamaModel.forward`` itself: every position of every layer,
then indexed. They must agree to float32 rounding: outputs, the KV cache a pass leaves, and
the LoRA gradients through them, with padding, with a shared cached head, with no padding
(sdpa's ``is_causal`` path below the last layer), for grouped-query attention and for eager
attention.
"""

from __future__ import annotations

import pytest
import torch
from policy_support import perturb_adapter
from transformers import AutoModelForCausalLM, LlamaConfig

from evosteer_core.infra.config import LoraConfig, PolicyConfig
from evosteer_core.policy.backbone import Policy, load_policy
from evosteer_core.policy.batch import right_pad
from evosteer_core.policy.read_positions import hidden_at, supports_read_positions

ATOL = 1e-5


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("read-positions-cache"))


def _trained(cache_dir: str, attn: str | None = None) -> Policy:
    """The tiny backbone with a non-zero adapter (θ ≠ ρ)."""
    policy = load_policy(
        PolicyConfig(lora=LoraConfig(r=8, alpha=16)),
        cache_dir=cache_dir,
        attn_implementation=attn,
        reuse=False,
    )
    return perturb_adapter(policy, 3)


def _seqs(lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 500, (n,), generator=gen).tolist() for n in lengths]


def _gather(hidden: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
    return hidden[torch.arange(len(hidden)).unsqueeze(1), read]


READ = torch.tensor([[29, 3, 0], [21, 21, 5], [40, 10, 39], [6, 6, 6]])
LENGTHS = (30, 22, 41, 7)


@pytest.mark.parametrize("attn", [None, "eager"])
@pytest.mark.parametrize("theta", [True, False])
def test_read_positions_equal_the_full_pass_with_padding(cache_dir, attn, theta):
    policy = _trained(cache_dir, attn)
    assert supports_read_positions(policy._decoder)
    ids, mask, pos = right_pad(_seqs(LENGTHS, 1), policy.tokenizer.pad_id)
    with torch.no_grad(), policy.adapter_context(theta):
        full = policy._decoder(input_ids=ids, attention_mask=mask, position_ids=pos)
        part, _ = policy.hidden(ids, mask, pos, read=READ)
    assert part.shape == (4, 3, 128)
    torch.testing.assert_close(part, _gather(full.last_hidden_state, READ), atol=ATOL, rtol=0)


def test_without_padding_the_causal_mask_is_made_for_the_last_layer(cache_dir):
    """Equal lengths: the layers below run sdpa with is_causal (no mask is built for them)."""
    policy = _trained(cache_dir)
    ids, mask, pos = right_pad(_seqs((17, 17, 17), 2), policy.tokenizer.pad_id)
    read = torch.tensor([[16, 0], [8, 9], [3, 16]])
    with torch.no_grad():
        full = policy._decoder(input_ids=ids, attention_mask=mask, position_ids=pos)
        part, _ = policy.hidden(ids, mask, pos, read=read)
    torch.testing.assert_close(part, _gather(full.last_hidden_state, read), atol=ATOL, rtol=0)


def test_a_cache_only_pass_leaves_the_full_pass_cache_and_reads_on_top_of_it(cache_dir):
    policy = _trained(cache_dir)
    head = torch.tensor([_seqs((9,), 3)[0]])
    ones, at = torch.ones_like(head), torch.arange(9).unsqueeze(0)
    with torch.no_grad():
        _, full_cache = policy.hidden(head, ones, at, use_cache=True)
        empty, cache = policy.hidden(
            head, ones, at, use_cache=True, read=torch.zeros(1, 0, dtype=torch.long)
        )
        assert empty.shape == (1, 0, 128)
        for a, b in zip(full_cache.layers, cache.layers, strict=True):
            torch.testing.assert_close(a.keys, b.keys, atol=ATOL, rtol=0)
            torch.testing.assert_close(a.values, b.values, atol=ATOL, rtol=0)
        full_cache.batch_repeat_interleave(4)
        cache.batch_repeat_interleave(4)
        ids, mask, pos = right_pad(_seqs(LENGTHS, 4), policy.tokenizer.pad_id, [9] * 4)
        mask = torch.cat([torch.ones(4, 9, dtype=mask.dtype), mask], dim=1)
        full, _ = policy.hidden(ids, mask, pos, full_cache, use_cache=True)
        part, _ = policy.hidden(ids, mask, pos, cache, use_cache=True, read=READ)
    torch.testing.assert_close(part, _gather(full, READ), atol=ATOL, rtol=0)


def test_lora_gradients_through_the_read_positions_equal_the_full_pass(cache_dir):
    policy = _trained(cache_dir)
    ids, mask, pos = right_pad(_seqs(LENGTHS, 5), policy.tokenizer.pad_id)
    weights = torch.randn(4, 3, 128, generator=torch.Generator().manual_seed(6))
    grads = []
    for read in (None, READ):
        policy.model.zero_grad(set_to_none=True)
        hidden, _ = policy.hidden(ids, mask, pos, read=read)
        picked = _gather(hidden, READ) if read is None else hidden
        (weights * policy.logits(picked)[..., :128]).sum().backward()
        grads.append([p.grad.clone() for p in policy.lora_parameters()])
    assert len(grads[0]) == 16  # A and B of q, k, v, o in both layers
    for full, part in zip(*grads, strict=True):
        scale = float(full.abs().max())
        assert scale > 0
        torch.testing.assert_close(part, full, atol=1e-5 * scale, rtol=0)


def test_grouped_query_attention(tmp_path):
    """SmolLM2's shape: fewer key/value heads than query heads (here 4 and 2), 3 layers."""
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    decoder = model.get_decoder()
    seqs = [torch.randint(1, 64, (n,)).tolist() for n in (12, 5, 9)]
    ids, mask, pos = right_pad(seqs, 0)
    read = torch.tensor([[11, 2], [4, 4], [0, 8]])
    with torch.no_grad():
        full = decoder(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
        part, _ = hidden_at(decoder, ids, mask, pos, read)
    torch.testing.assert_close(part, _gather(full, read), atol=ATOL, rtol=0)
