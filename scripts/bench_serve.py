"""Time N chat completions sent at once to the managed SmolLM2 server (docs/performance.md,
"A real LLM"): with and without continuous batching, the replies greedy.

    python scripts/bench_serve.py --requests 8 --tokens 32 [--no-batching] [--threads 1]
                                  [--dtype bfloat16 | --engine llama.cpp]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from evosteer_core.episode.rollout import run_concurrently
from evosteer_core.executors.openai import OpenAIExecutor
from evosteer_core.executors.serve import ManagedServer
from evosteer_core.infra.config import SERVE_DTYPES, SERVE_ENGINES, ServeConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-batching", action="store_true")
    ap.add_argument("--dtype", choices=SERVE_DTYPES, default=None, help="the server's weights")
    ap.add_argument("--engine", choices=SERVE_ENGINES, default=None, help="default transformers")
    args = ap.parse_args()
    cfg = ServeConfig(
        threads=args.threads,
        continuous_batching=not args.no_batching,
        dtype=args.dtype,
        engine=args.engine,
    )
    with tempfile.TemporaryDirectory() as tmp, ManagedServer(cfg, Path(tmp) / "serve.log") as srv:
        ex = OpenAIExecutor(srv.base_url, srv.model_id, temperature=0.0, timeout_s=900)

        def ask(i: int):
            text = f"Write a Python function that returns the sum of the first {i + 3} squares."
            return ex.chat([{"role": "user", "content": text}], args.tokens, seed=i)

        start = time.monotonic()
        replies = run_concurrently(
            [lambda i=i: ask(i) for i in range(args.requests)], args.requests
        )
        wall = time.monotonic() - start
    tokens = sum(r.completion_tokens for r in replies)
    mode = "no batching" if args.no_batching else "continuous batching"
    mode += f", {args.engine or 'transformers'}, {args.dtype or 'stored'} weights"
    print(
        f"{mode}: {args.requests} requests at once, {tokens} tokens in {wall:.1f} s "
        f"({tokens / wall:.2f} tokens/s)"
    )


if __name__ == "__main__":
    main()
