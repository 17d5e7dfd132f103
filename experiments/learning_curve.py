"""Learning curve of the tiny-sim run: held-out reward of π_θ vs ρ, loss vs the anchor-only level.

Usage: python experiments/learning_curve.py [--steps 60] [--batch 16] [--seeds 42 43 44]
           [--eval-every 10] [--heldout 16] [--device cpu] [--lr 1e-3]
           [--png docs/learning_curve.png] [--json FILE] [--from-json FILE ...]
           [--mode-temperature 0.5] [--set sim.orchestration_effect=5 ...]
The runs of docs/learning.md use ``--set sim.orchestration_effect=5`` (a simulator where the
team decides more; on the default one the most AnchorTB can gain is +0.04, Prop. A.6).
Everything here is SIMULATED (sim executor). Prints the held-out curve per seed and a summary,
and saves a PNG with the curves. ``--json`` also saves the raw curves; ``--from-json`` skips
training and re-plots/summarizes saved curves (e.g. from runs on other machines).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: experiments.*

from evosteer_core.episode.world import build_world  # noqa: E402
from evosteer_core.evaluation.rollouts import evaluation_rollouts  # noqa: E402
from evosteer_core.infra.config import load_config  # noqa: E402
from evosteer_core.infra.configio import parse_override  # noqa: E402
from evosteer_core.training.loop import train_step  # noqa: E402
from evosteer_core.training.session import init_state, open_session  # noqa: E402
from experiments.tilt import (  # noqa: E402
    reweighted_gain,
    tilt_report,
    trajectory_log_ratios,
)


def paired_difference(theta: pd.DataFrame, rho: pd.DataFrame) -> tuple[float, float]:
    """Mean of θ's minus ρ's reward over episodes that share every seed (same record and run
    index), and its standard error: the sampled comparison, paired by common random numbers."""
    key = ["record_id", "rollout_index"]
    both = theta[[*key, "reward"]].merge(rho[[*key, "reward"]], on=key, suffixes=("_t", "_r"))
    if len(both) != len(theta) or len(both) != len(rho):
        raise ValueError(f"{len(theta)} θ and {len(rho)} ρ episodes do not pair up")
    diff = (both["reward_t"] - both["reward_r"]).to_numpy()
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(diff)))


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, list[float]]:
    overrides = {
        "train.seed": seed,
        "train.batch_size": args.batch,
        "train.rollouts_theta": args.rollouts,
        "train.rollouts_rho": args.rollouts,
        "sim.n_heldout_per_family": args.heldout,
        "skills.enabled": False,
        "policy.device": args.device,
        "train.actor.lr": args.lr,
        "policy.lora.r": args.lora_r,
        "policy.lora.alpha": 2 * args.lora_r,
        "policy.lora.target_modules": args.lora_targets,
        **dict(parse_override(kv) for kv in args.set),
    }
    cfg = load_config(args.config, overrides=overrides)
    eval_cfgs = {
        key: load_config(args.config, overrides={**overrides, "policy.temperature": temp})
        for key, temp in (("", args.eval_temperature), ("_mode", args.mode_temperature))
        if temp is not None
    }
    world = build_world(cfg)
    state = init_state(cfg)
    curve: dict[str, list[float]] = {k: [] for k in ("step", "theta", "rho", "loss", "anchor")}
    evals: dict[str, list[float]] = {
        k: [] for k in ("step", "tilt_auc", "tilt_gap", "is_gain", "is_se")
    }
    for key in eval_cfgs:
        evals.update({f"theta{key}": [], f"rho{key}": [], f"diff{key}": [], f"diff_se{key}": []})
    t0 = time.time()
    for step in range(0, args.steps + 1):
        if step:
            s = open_session(cfg, state, world)
            state, m = train_step(s, state, step)
            curve["step"].append(step)
            curve["theta"].append(m["reward_theta"])
            curve["rho"].append(m["reward_rho"])
            curve["loss"].append(m["loss"])
            curve["anchor"].append(m["anchor_only_loss"])
            print(
                f"seed {seed} step {step:3d}  train θ {m['reward_theta']:.3f} "
                f"ρ {m['reward_rho']:.3f}  loss {m['loss']:.3f} "
                f"(anchor-only {m['anchor_only_loss']:.3f})  [{time.time() - t0:.0f}s]",
                flush=True,
            )
        if step % args.eval_every == 0:
            evals["step"].append(step)
            line = f"seed {seed} step {step:3d}"
            for key, eval_cfg in eval_cfgs.items():
                s = open_session(eval_cfg, state, world)
                th_tr, _ = evaluation_rollouts(
                    s, world.heldout_records, True, args.eval_runs, "heldout"
                )
                rho_tr, rho_dec = evaluation_rollouts(
                    s, world.heldout_records, False, args.eval_runs, "heldout"
                )
                th, rh = float(th_tr["reward"].mean()), float(rho_tr["reward"].mean())
                diff, diff_se = paired_difference(th_tr, rho_tr)
                evals[f"theta{key}"].append(th)
                evals[f"rho{key}"].append(rh)
                evals[f"diff{key}"].append(diff)
                evals[f"diff_se{key}"].append(diff_se)
                temp = eval_cfg.policy.temperature
                line += (
                    f"  held-out (T={temp:g}) θ {th:.3f} ρ {rh:.3f} θ−ρ {diff:+.3f} ± {diff_se:.3f}"
                )
                if not key:  # the learned tilt, on ρ's own held-out trajectories
                    ratios = trajectory_log_ratios(s.policy, rho_dec)
                    w = ratios.loc[rho_tr["traj_id"]]
                    tilt = tilt_report(rho_tr["reward"], w)
                    paired = reweighted_gain(rho_tr["reward"], w)
                    evals["tilt_auc"].append(tilt.auc)
                    evals["tilt_gap"].append(tilt.gap)
                    evals["is_gain"].append(paired.gain)
                    evals["is_se"].append(paired.se)
                    line += (
                        f"  tilt AUC {tilt.auc:.3f} gap {tilt.gap:+.3f}"
                        f"  reweighted gain {paired.gain:+.3f} ± {paired.se:.3f}"
                    )
            print(f"{line}  [{time.time() - t0:.0f}s]", flush=True)
    if args.save_state:
        out = Path(args.save_state) / f"state_seed{seed}_step{args.steps}.pt"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(state.to_bytes())
        print(f"saved the trained state (adapter, heads, optimizer) to {out}", flush=True)
    return {"curve": curve, "evals": evals}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", default=None, help="run config (default: embedded tiny-sim)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rollouts", type=int, default=2)
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-runs", type=int, default=2)
    p.add_argument("--heldout", type=int, default=16)
    p.add_argument("--png", default="docs/learning_curve.png")
    p.add_argument("--device", default="cpu")
    p.add_argument("--lr", type=float, default=1e-3, help="actor (LoRA) learning rate")
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--lora-targets", nargs="+", default=["q_proj", "k_proj", "v_proj", "o_proj"])
    p.add_argument(
        "--eval-temperature", type=float, default=1.0, help="orchestrator temperature at eval"
    )
    p.add_argument(
        "--mode-temperature",
        type=float,
        default=None,
        help="also evaluate at this (low) temperature: the learned tilt near its mode",
    )
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: run seeds in parallel)"
    )
    p.add_argument("--set", nargs="*", default=[], help="extra config overrides KEY=VALUE")
    p.add_argument("--json", default=None, help="also save the raw curves here")
    p.add_argument("--save-state", default=None, help="save each seed's trained state here")
    p.add_argument("--from-json", nargs="+", default=None, help="plot saved curves instead")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.from_json:
        results = {}
        for path in args.from_json:
            results.update({int(k): v for k, v in json.loads(Path(path).read_text()).items()})
    else:
        results = {seed: run_seed(args, seed) for seed in args.seeds}
        if args.json:
            Path(args.json).write_text(json.dumps(results))
    print("\nSIMULATED executor. Held-out mean reward (θ trained vs untrained):")
    for key, label in (("", "sampling temperature"), ("_mode", "mode temperature")):
        gains = []
        for seed, r in results.items():
            e = r["evals"]
            if f"theta{key}" not in e:
                continue
            gains.append(e[f"theta{key}"][-1] - e[f"theta{key}"][0])
            paired = ""
            if e.get(f"diff{key}"):  # same seeds, same v̂ snapshot in the prompts
                paired = f"; θ − ρ {e[f'diff{key}'][-1]:+.3f} ± {e[f'diff_se{key}'][-1]:.3f} paired"
            print(
                f"  {label}, seed {seed}: untrained θ {e[f'theta{key}'][0]:.3f} → trained θ "
                f"{e[f'theta{key}'][-1]:.3f} (ρ {e[f'rho{key}'][-1]:.3f}); gain {gains[-1]:+.3f}"
                + paired
            )
        if gains:
            spread = np.std(gains, ddof=1) if len(gains) > 1 else 0.0
            print(f"  {label}: mean gain {np.mean(gains):+.3f} ± {spread:.3f} (sd over seeds)")
    aucs = [r["evals"]["tilt_auc"][-1] for r in results.values() if r["evals"].get("tilt_auc")]
    gaps = [r["evals"]["tilt_gap"][-1] for r in results.values() if r["evals"].get("tilt_gap")]
    if aucs:
        print(
            "  learned tilt on ρ's held-out trajectories (untrained: AUC 0.5, gap 0): "
            + ", ".join(f"AUC {a:.3f} gap {g:+.3f}" for a, g in zip(aucs, gaps, strict=True))
            + f"; mean AUC {np.mean(aucs):.3f}"
        )
    paired = [
        (seed, r["evals"]["is_gain"][-1], r["evals"]["is_se"][-1])
        for seed, r in results.items()
        if r["evals"].get("is_gain")
    ]
    if paired:
        print(
            "  θ's gain over ρ by reweighting ρ's held-out trajectories (paired, ± se): "
            + ", ".join(f"seed {seed} {g:+.3f} ± {se:.3f}" for seed, g, se in paired)
        )
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for n, (seed, r) in enumerate(results.items()):
        e, c, color = r["evals"], r["curve"], f"C{n % 10}"
        axes[0].plot(e["step"], e["theta"], color=color, marker="o", label=f"θ (seed {seed})")
        axes[0].plot(e["step"], e["rho"], color=color, ls="--", label=f"ρ (seed {seed})")
        if "theta_mode" in e:
            axes[0].plot(
                e["step"],
                e["theta_mode"],
                color=color,
                ls=":",
                marker="s",
                label=f"θ at mode T (seed {seed})",
            )
        axes[1].plot(c["step"], c["loss"], color=color, label=f"AnchorTB loss (seed {seed})")
        axes[1].plot(
            c["step"],
            c["anchor"],
            color=color,
            ls=":",
            alpha=0.6,
            label=f"anchor-only level (seed {seed})",
        )
    axes[0].set(title="Held-out reward (SIMULATED executor)", xlabel="step", ylabel="mean reward")
    axes[1].set(title="Loss vs anchor-only level", xlabel="step", ylabel="loss")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    Path(args.png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=110)
    print(f"saved {args.png}")


if __name__ == "__main__":
    main()
