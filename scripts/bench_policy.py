"""Benchmark the orchestrator policy on the tiny backbone (CPU): sampling, scoring, backward.

Prints: sampled decisions per second (batch of 64 pending decisions, compact prompts,
realistic legal sets), the prompt prefill share of sampling and the estimated cost of
re-running the prefix at every depth instead of the KV cache, scoring time for
trajectories × actions under θ and ρ, forward+backward time, and h_ρ encoding time.
    python scripts/bench_policy.py [--trajectories 192] [--actions 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: experiments.*

from evosteer_core.infra.config import PolicyConfig
from evosteer_core.infra.seeding import numpy_rng, torch_generator
from evosteer_core.policy.backbone import load_policy
from evosteer_core.policy.batch import right_pad
from evosteer_core.policy.encode import encode_h_rho
from evosteer_core.policy.render import render_compact
from evosteer_core.policy.sampling import sample_actions
from evosteer_core.policy.scoring import score_actions
from experiments.vocabulary import random_public_state


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    """Median wall time of ``repeats`` calls and the last result."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=192)
    parser.add_argument("--actions", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="bench-policy-")
    policy = load_policy(
        PolicyConfig(renderer="compact"), cache_dir=cache_dir, attn_implementation=args.attn
    )
    rng = numpy_rng("bench-policy")
    states = [random_public_state(rng) for _ in range(args.trajectories * args.actions)]
    prompts = [render_compact(s) for s in states]
    legal = [s["legal_actions"] for s in states]
    tok = policy.tokenizer
    lengths = [len(tok.encode_prompt(p)) for p in prompts]
    print(f"backbone tiny, LoRA r={policy.config.lora.r}, attn={args.attn}, threads={args.threads}")
    print(f"compact prompt tokens: mean {statistics.mean(lengths):.0f}, max {max(lengths)}")
    print(f"legal actions per decision: mean {statistics.mean(len(a) for a in legal):.1f}")

    batch_p, batch_l = prompts[: args.batch], legal[: args.batch]
    gens = lambda: [torch_generator("bench", i) for i in range(args.batch)]  # noqa: E731
    seconds, samples = timed(lambda: sample_actions(policy, batch_p, batch_l, gens()), 3)
    depth = max(sum(len(a) > 1 for a in s.allowed) for s in samples)
    print(
        f"sampling: {args.batch} decisions in {seconds:.2f} s = {args.batch / seconds:.1f} decisions/s"
        f" ({depth} branching depths)"
    )
    ids, mask, pos = right_pad([tok.encode_prompt(p) for p in batch_p], tok.pad_id)
    with torch.no_grad():
        prefill, _ = timed(lambda: policy.hidden(ids, mask, pos, use_cache=True), 3)
    print(
        f"  prompt prefill forward {prefill:.2f} s; re-running the prefix at each of {depth} "
        f"depths instead of a KV cache would cost about {depth * prefill:.2f} s"
    )

    n = len(prompts)
    gens_all = [torch_generator("bench-all", i) for i in range(n)]
    chosen = [s.text for s in sample_actions(policy, prompts, legal, gens_all)]
    for name, adapter in (("theta", True), ("rho", False)):
        seconds, _ = timed(
            lambda a=adapter: score_actions(policy, prompts, chosen, legal, a, False), 1
        )
        print(
            f"scoring {args.trajectories}x{args.actions} = {n} actions under {name}: {seconds:.2f} s",
            flush=True,
        )

    def forward_backward() -> None:
        """Gradient accumulation: one backward per micro-batch keeps activation memory bounded."""
        policy.model.zero_grad(set_to_none=True)
        for start in range(0, n, args.batch):
            part = slice(start, start + args.batch)
            score_actions(
                policy, prompts[part], chosen[part], legal[part], True, True
            ).sum().backward()

    seconds, _ = timed(forward_backward, 1)
    print(
        f"forward+backward (theta, {n} actions in micro-batches of {args.batch}): {seconds:.2f} s",
        flush=True,
    )
    seconds, _ = timed(lambda: encode_h_rho(policy, prompts), 1)
    print(f"h_rho encoding ({n} prompts): {seconds:.2f} s")


if __name__ == "__main__":
    main()
