"""The floor under one decode step of SmolLM2-135M on this CPU (docs/performance.md, "What the
server's time is"): the time to multiply a batch of token vectors by every weight matrix of
the model once (what any server must do a step, attention and sampling aside), and, where
``ctranslate2`` is installed (it is not a dependency: ``pip install ctranslate2``), the
tokens/s of that C++ engine on the same weights at batch 1/4/8/16, float32 and int8.

    python scripts/bench_decode_floor.py [--threads 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

import torch

from evosteer_core.executors.serve import model_folder

BATCHES = (1, 4, 8, 16)
PROMPT = "Write a Python function that returns the sum of the first 12 squares, with tests."


def weight_matrices(folder: Path) -> list[torch.Tensor]:
    """Every matrix a decode step multiplies by: the layers' projections and the LM head
    (tied to the embedding in SmolLM2, so read once more a step)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    mats = [
        p.detach().contiguous()
        for name, p in model.named_parameters()
        if p.dim() == 2 and "embed_tokens" not in name
    ]
    return mats + [model.get_output_embeddings().weight.detach().contiguous()]


def matmul_floor(mats: list[torch.Tensor], batch: int, rounds: int) -> float:
    """Best seconds over ``rounds`` for one pass of ``batch`` vectors through every matrix."""
    xs = [torch.randn(batch, m.shape[1]) for m in mats]
    best = float("inf")
    for _ in range(rounds + 1):  # the first pass warms the caches and the kernels
        start = time.perf_counter()
        for x, m in zip(xs, mats, strict=True):
            x @ m.T
        best = min(best, time.perf_counter() - start)
    return best


def ctranslate2_rates(folder: Path, threads: int, rounds: int, tokens: int) -> None:
    """Print CTranslate2's sampled generation rate (tokens/s) for each batch."""
    import ctranslate2
    from ctranslate2.converters import TransformersConverter
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    prompt = tok.convert_ids_to_tokens(ids)
    with tempfile.TemporaryDirectory() as tmp:
        TransformersConverter(str(folder)).convert(tmp, force=True)
        for compute in ("float32", "int8_float32"):
            gen = ctranslate2.Generator(
                tmp, device="cpu", compute_type=compute, intra_threads=threads
            )
            for batch in BATCHES:
                rates = []
                for _ in range(rounds):
                    start = time.perf_counter()
                    gen.generate_batch(
                        [prompt] * batch,
                        max_length=tokens,
                        min_length=tokens,
                        sampling_temperature=0.3,
                        include_prompt_in_result=False,
                    )
                    rates.append(batch * tokens / (time.perf_counter() - start))
                shown = ", ".join(f"{r:.1f}" for r in rates)
                print(f"ctranslate2 {compute:>12} batch {batch:>2}: {shown} tokens/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128, help="generated per sequence")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    folder = model_folder("smollm2")
    mats = weight_matrices(folder)
    n = sum(m.numel() for m in mats)
    print(f"{len(mats)} matrices, {n / 1e6:.1f} M weights, {4 * n / 1e6:.0f} MB float32 a step")
    for batch in BATCHES:
        s = matmul_floor(mats, batch, args.rounds)
        print(
            f"matmul floor batch {batch:>2}: {1e3 * s:6.1f} ms a step, "
            f"{4 * n / s / 1e9:5.1f} GB/s of weights, ceiling {batch / s:6.1f} tokens/s"
        )
    if importlib.util.find_spec("ctranslate2") is None:
        print("ctranslate2 not installed: its rates skipped (pip install ctranslate2)")
        return
    ctranslate2_rates(folder, args.threads, args.rounds, args.tokens)


if __name__ == "__main__":
    main()
