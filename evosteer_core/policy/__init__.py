"""The orchestrator policy π_θ and its reference ρ (docs/method.md §1.6): backbones with a LoRA adapter,
the grammar trie, batched sampling and scoring, h_ρ encodings, and prompt renderers."""

from evosteer_core.policy.backbone import Policy, load_policy, tiny_model_folder
from evosteer_core.policy.encode import encode_h_rho
from evosteer_core.policy.render import render, render_compact, render_full
from evosteer_core.policy.sampling import SampledAction, sample_actions
from evosteer_core.policy.scoring import score_actions
from evosteer_core.policy.tokenizer import PolicyTokenizer, TokenizationError
from evosteer_core.policy.trie import ActionTrie

__all__ = [
    "ActionTrie",
    "Policy",
    "PolicyTokenizer",
    "SampledAction",
    "TokenizationError",
    "encode_h_rho",
    "load_policy",
    "render",
    "render_compact",
    "render_full",
    "sample_actions",
    "score_actions",
    "tiny_model_folder",
]
