"""Pre-train the tiny backbone as a language model on rendered SIMULATED states (experiment).

The tiny backbone starts from a random initialization, so its hidden states carry little of
the state it reads (docs/learning.md). This script builds the seeded tiny folder, then trains
every weight by next-token prediction on compact prompts followed by the action a
uniformly random legal policy took (``--episodes`` episodes per family on the *training*
split, tiny-sim budget, orchestrator tokens charged), and saves a normal HF folder. Used as
``policy.backbone: <folder>``, its ρ behaves roughly like the random legal policy (high
Var_ρ(p), docs/learning.md) but its features describe the state. SIMULATED data only.

Usage: python experiments/pretrain_tiny.py OUT_DIR [--episodes 200] [--epochs 2] [--lr 1e-3]
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.episode.runtime import DecisionCharge, Episode
from evosteer_core.infra.config import load_config
from evosteer_core.infra.model_cache import cache_root
from evosteer_core.infra.seeding import derive_seed
from evosteer_core.policy.backbone import tiny_model_folder
from evosteer_core.policy.batch import right_pad
from evosteer_core.policy.render import public_state, render_compact
from evosteer_core.policy.tokenizer import PolicyTokenizer
from evosteer_core.sim import SimExecutor, make_sim_suite


def random_policy_texts(episodes: int, seed: int, tok: PolicyTokenizer) -> list[list[int]]:
    """Token ids of (prompt + chosen action + EOS) for every decision of random-policy episodes."""
    cfg = load_config(None)
    catalogue, executor = default_catalogue(), SimExecutor()
    out = []
    for task in make_sim_suite(episodes, cfg.sim.seed, "train"):
        ep = Episode(
            task, catalogue, cfg.budget, executor, evaluate, run_seed=seed, episode_key="lm"
        )
        rng = random.Random(derive_seed(seed, task.record_id, "pretrain-policy"))
        while not ep.stopped:
            legal = ep.legal_actions()
            action = legal[rng.randrange(len(legal))]
            prompt = tok.encode_prompt(
                render_compact(public_state(ep, value=0.5, value_change=0.0))
            )
            action_ids = list(tok.encode_action(action.to_json()))
            out.append(prompt + action_ids)
            charge = DecisionCharge()  # as in a rollout: a forced decision costs nothing
            if len(legal) > 1:
                n_in, n_out = len(prompt), len(action_ids)
                charge = DecisionCharge(n_in, n_out, executor.decision_seconds(n_in, n_out))
            ep.apply(action, charge)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out", help="folder to write the pre-trained backbone to")
    p.add_argument("--episodes", type=int, default=200, help="episodes per family")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(derive_seed(args.seed, "pretrain-tiny"))
    source = tiny_model_folder(cache_root() / "models", args.seed)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    hf_tok = AutoTokenizer.from_pretrained(source)
    tok = PolicyTokenizer(hf_tok, max_prompt_tokens=1792)
    t0 = time.time()
    seqs = random_policy_texts(args.episodes, args.seed, tok)
    n_tokens = sum(len(s) for s in seqs)
    print(f"{len(seqs)} decisions, {n_tokens} tokens  [{time.time() - t0:.0f}s]", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    rng = np.random.default_rng(args.seed)
    model.train()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(seqs))
        losses = []
        for start in range(0, len(order), args.batch):
            chunk = [seqs[i] for i in order[start : start + args.batch]]
            ids, mask, pos = right_pad(chunk, tok.pad_id)
            labels = ids.masked_fill(mask == 0, -100)
            loss = model(input_ids=ids, attention_mask=mask, position_ids=pos, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
        print(
            f"epoch {epoch}: mean token NLL {np.mean(losses):.4f} (last 20 batches "
            f"{np.mean(losses[-20:]):.4f})  [{time.time() - t0:.0f}s]",
            flush=True,
        )
    model.eval()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    hf_tok.save_pretrained(args.out)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
