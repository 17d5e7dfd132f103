"""A decoder pass whose last layer runs only at the positions that are read (docs/performance.md).

Sampling and scoring read the last layer's output at a few positions of each row (the tokens
whose next-token logits are needed, and the prompt's last token for h_ρ), and the shared
prompt heads only fill the KV cache. Every earlier layer feeds keys and values of every
position to the layer above it, but the last layer's output at a position nobody reads is
never used: its keys and values are needed at every position (they are cached and attended
to), its queries, attention, output projection, MLP and final norm only where read. On the
tiny backbone (2 layers, an MLP 4× the width) that is ~40 % of a pass's FLOPs. Causal attention
and position-wise layers make the result equal, up to float rounding, to the full pass at
the read positions (tested against it, ``tests/test_read_positions.py``).
"""

from __future__ import annotations

import torch
from transformers import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaModel,
    eager_attention_forward,
    rotate_half,
)


def supports_read_positions(decoder: torch.nn.Module) -> bool:
    """Whether ``decoder`` is a Llama decoder (the tiny backbone and SmolLM2 are) with SDPA or
    eager attention, whose layer structure :func:`hidden_at` follows; other backbones run the
    full pass."""
    return isinstance(decoder, LlamaModel) and decoder.config._attn_implementation in (
        "sdpa",
        "eager",
    )


def hidden_at(
    decoder: LlamaModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    read: torch.Tensor,
    cache: Cache | None = None,
    use_cache: bool = False,
) -> tuple[torch.Tensor, Cache | None]:
    """Last-layer hidden states (after the final norm) at ``read`` [B, K] (indices into each
    row's T input positions): [B, K, d], and the KV cache with all T positions added.

    The layers below the last run as ``LlamaModel.forward`` runs them (same mask, rotary
    embedding and calls); the last layer computes keys and values at every position and the
    rest at the read ones. ``K = 0`` (a pass that only fills the cache) skips the rest.
    """
    embeds = decoder.embed_tokens(input_ids)
    if use_cache and cache is None:
        cache = DynamicCache(config=decoder.config)
    mask_args = dict(
        config=decoder.config,
        inputs_embeds=embeds,
        attention_mask=attention_mask,
        cache=cache,
        position_ids=position_ids,
    )
    causal_mask = create_causal_mask(**mask_args)
    # the last layer's queries are a subset, so it needs the mask itself where the layers
    # below use sdpa's is_causal (made here: the cache's length grows as the layers run)
    last_mask = causal_mask
    if last_mask is None and read.shape[1] > 0:
        last_mask = create_causal_mask(**mask_args, allow_is_causal_skip=False)
    hidden = embeds
    rotary = decoder.rotary_emb(hidden, position_ids=position_ids)
    layers = decoder.layers[: decoder.config.num_hidden_layers]
    for layer in layers[:-1]:
        hidden = layer(
            hidden,
            attention_mask=causal_mask,
            position_embeddings=rotary,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
        )
    last = layers[-1]
    attn = last.self_attn
    batch, width = hidden.shape[:2]
    normed = last.input_layernorm(hidden)
    cos, sin = (t.expand(batch, -1, -1) for t in rotary)
    keys = attn.k_proj(normed).view(batch, width, -1, attn.head_dim).transpose(1, 2)
    values = attn.v_proj(normed).view(batch, width, -1, attn.head_dim).transpose(1, 2)
    keys = keys * cos.unsqueeze(1) + rotate_half(keys) * sin.unsqueeze(1)
    if cache is not None:
        keys, values = cache.update(keys, values, attn.layer_idx)
    n_read = read.shape[1]
    if n_read == 0:
        return hidden.new_zeros(batch, 0, hidden.shape[-1]), cache if use_cache else None
    rows = torch.arange(batch, device=read.device).unsqueeze(1)
    queries = attn.q_proj(normed[rows, read]).view(batch, n_read, -1, attn.head_dim)
    queries = queries.transpose(1, 2)
    cos_q, sin_q = cos[rows, read].unsqueeze(1), sin[rows, read].unsqueeze(1)
    queries = queries * cos_q + rotate_half(queries) * sin_q
    assert last_mask is not None
    last_mask = last_mask.expand(batch, -1, -1, -1)
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(
        decoder.config._attn_implementation, eager_attention_forward
    )
    out, _ = attend(
        attn,
        queries,
        keys,
        values,
        last_mask[rows, :, read].transpose(1, 2),
        dropout=0.0,
        scaling=attn.scaling,
        is_causal=False,
    )
    out = attn.o_proj(out.reshape(batch, n_read, -1).contiguous())
    hidden = hidden[rows, read] + out
    hidden = hidden + last.mlp(last.post_attention_layernorm(hidden))
    return decoder.norm(hidden), cache if use_cache else None
