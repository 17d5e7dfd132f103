"""Train the tiny backbone's byte-level BPE tokenizer offline and write it to the package.

The corpus is the action grammar and prompt vocabulary: canonical action texts and rendered
prompts (both renderers) of seeded synthetic public states. Usage:
    python scripts/build_tiny_tokenizer.py [--vocab-size 512] [--states 3000] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: experiments.*

from evosteer_core.policy.render import SYSTEM_COMPACT, SYSTEM_FULL, render_compact, render_full
from evosteer_core.policy.tokenizer import EOS_TOKEN, PAD_TOKEN, TINY_TOKENIZER_DIR
from experiments.vocabulary import random_public_state


def corpus(states: int, seed: int) -> list[str]:
    """Rendered prompts and their legal action texts for ``states`` seeded synthetic states."""
    rng = np.random.default_rng(seed)
    texts = [SYSTEM_FULL, SYSTEM_COMPACT]
    for i in range(states):
        state = random_public_state(rng)
        texts.append(render_compact(state))
        if i % 10 == 0:
            texts.append(render_full(state))
        texts.extend(state["legal_actions"])
    return texts


def train(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (256 byte symbols + merges + EOS/PAD) without normalizer or prefix space."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--states", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=TINY_TOKENIZER_DIR)
    args = parser.parse_args()
    tokenizer = train(corpus(args.states, args.seed), args.vocab_size)
    tokenizer.save_pretrained(args.out)
    print(f"wrote {args.out} (vocab {len(tokenizer)})")


if __name__ == "__main__":
    main()
