"""Tokenization for the orchestrator: prompts (left-truncated, system text kept) and actions.

An action is tokenized as its text followed by EOS (docs/method.md §1.2); each action's tokens must
decode back to its exact text, or the grammar mask could not be trusted.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from evosteer_core.infra.memo import BoundedMemo
from evosteer_core.policy.render import SYSTEM_SEPARATOR

TINY_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "data" / "tiny_tokenizer"
"""The byte-level BPE trained offline by ``scripts/build_tiny_tokenizer.py``."""
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"

MEMO_SIZE = 8192
"""Prompts (and legal sets) kept per tokenizer: more than a paper-shape step has decisions."""


class TokenizationError(ValueError):
    """A text that the backbone's tokenizer cannot represent faithfully."""


def load_tiny_tokenizer() -> PreTrainedTokenizerBase:
    """The shipped tiny tokenizer (offline, from the package data folder)."""
    if not (TINY_TOKENIZER_DIR / "tokenizer.json").exists():
        raise FileNotFoundError(
            f"tiny tokenizer missing at {TINY_TOKENIZER_DIR}; run scripts/build_tiny_tokenizer.py"
        )
    return AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)


class PolicyTokenizer:
    """Wraps a HF tokenizer: prompt encoding with truncation, cached round-tripped action ids."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_prompt_tokens: int) -> None:
        if tokenizer.eos_token_id is None:
            raise TokenizationError("the backbone's tokenizer has no EOS token")
        self.hf = tokenizer
        self.eos_id = int(tokenizer.eos_token_id)
        self.pad_id = int(
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        )
        self.max_prompt_tokens = max_prompt_tokens
        self._action_cache: dict[str, tuple[int, ...]] = {}
        self._prompts: BoundedMemo[tuple[str, int], tuple[int, ...]] = BoundedMemo(MEMO_SIZE)
        self._systems: BoundedMemo[str, list[int]] = BoundedMemo(64)

    def _ids(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def encode_prompt(self, prompt: str) -> list[int]:
        """Prompt ids; beyond ``max_prompt_tokens`` the body is cut from the left, system kept.

        The system text is everything up to and including the first ``SYSTEM_SEPARATOR``; it and
        the body are tokenized separately so truncation never splits a token. Results are
        memoized per (prompt, limit); the caller gets its own list.
        """
        key = (prompt, self.max_prompt_tokens)
        return list(self._prompts.get(key, lambda: tuple(self._encode_prompt(prompt))))

    def _encode_prompt(self, prompt: str) -> list[int]:
        if not prompt:
            raise TokenizationError("empty prompt")
        head, sep, body = prompt.partition(SYSTEM_SEPARATOR)
        system = head + sep
        system_ids = self._systems.get(system, lambda: self._ids(system)) if sep else []
        body_ids = self._ids(body if sep else prompt)
        room = self.max_prompt_tokens - len(system_ids)
        if room <= 0:
            raise TokenizationError(
                f"system text alone has {len(system_ids)} tokens; the prompt limit is "
                f"{self.max_prompt_tokens}"
            )
        return system_ids + body_ids[-room:]

    def encode_action(self, text: str) -> tuple[int, ...]:
        """Action ids followed by EOS; raises if the ids do not decode back to ``text``."""
        cached = self._action_cache.get(text)
        if cached is not None:
            return cached
        ids = self._ids(text)
        if self.eos_id in ids:
            raise TokenizationError(f"action text contains the EOS token: {text!r}")
        decoded = self.hf.decode(ids, clean_up_tokenization_spaces=False)
        if decoded != text:
            raise TokenizationError(
                f"tokenizer does not round-trip action {text!r} (decodes to {decoded!r})"
            )
        out = (*ids, self.eos_id)
        self._action_cache[text] = out
        return out
