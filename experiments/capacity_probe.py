"""Can the backbone + LoRA represent a useful tilt at all? A supervised probe (SIMULATED).

AnchorTB asks θ to reweight ρ's trajectories toward the successful ones. This probe takes the
RL signal out of the question: it samples ``--runs`` ρ trajectories per training task, keeps
the successful ones, and fits the adapter by maximum likelihood on their sampled decisions
(success-filtered behaviour cloning, ``--epochs`` passes, Adam). It then reports, on the
held-out tasks, θ's mean reward against the untrained policy's (same seeds) and the tilt AUC
of Σ Δℓ on ρ's held-out trajectories (`experiments/tilt.py`). If even this does not lift the
held-out reward, the backbone's state features are the bottleneck, not the objective.

Usage: python experiments/capacity_probe.py [--runs 8] [--epochs 4] [--lr 1e-3] [--heldout 16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: experiments.*

from evosteer_core.evaluation.rollouts import evaluation_rollouts
from experiments.probe_session import add_session_options, untrained_session
from experiments.tilt import tilt_report, trajectory_log_ratios


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=8, help="ρ trajectories per training task")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--chunk", type=int, default=64, help="decisions per gradient step")
    p.add_argument("--eval-runs", type=int, default=2)
    add_session_options(p)
    args = p.parse_args()
    s = untrained_session(args)
    heldout = s.world.heldout_records
    t0 = time.time()
    before, _ = evaluation_rollouts(s, heldout, True, args.eval_runs, "heldout")
    tr, de = evaluation_rollouts(s, s.world.train_records, False, args.runs, "probe")
    winners = set(tr.loc[tr["reward"] >= 0.5, "traj_id"])
    data = de[de["traj_id"].isin(winners) & (de["legal"].map(len) > 1)].reset_index(drop=True)
    print(
        f"SIMULATED. {len(tr)} ρ training trajectories (reward {tr['reward'].mean():.3f}), "
        f"{len(winners)} successful, {len(data)} sampled decisions to clone  [{time.time() - t0:.0f}s]",
        flush=True,
    )
    params = s.policy.trainable_parameters()
    opt = torch.optim.Adam(params, lr=args.lr)
    rng = np.random.default_rng(s.cfg.train.seed)
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(data))
        nll = []
        for start in range(0, len(order), args.chunk):
            sub = data.iloc[order[start : start + args.chunk]]
            opt.zero_grad(set_to_none=True)
            logp = s.policy.score(
                sub["prompt"].tolist(),
                sub["action"].tolist(),
                sub["legal"].tolist(),
                use_adapter=True,
                requires_grad=True,
            )
            loss = -logp.mean()
            loss.backward()
            opt.step()
            nll.append(loss.item())
        print(f"epoch {epoch}: mean NLL {np.mean(nll):.4f}  [{time.time() - t0:.0f}s]", flush=True)
    after, _ = evaluation_rollouts(s, heldout, True, args.eval_runs, "heldout")
    rho_tr, rho_de = evaluation_rollouts(s, heldout, False, args.eval_runs, "heldout")
    ratios = trajectory_log_ratios(s.policy, rho_de)
    tilt = tilt_report(rho_tr["reward"], ratios.loc[rho_tr["traj_id"]])
    print(
        f"held-out ({len(before)} paired episodes): untrained θ {before['reward'].mean():.3f} → "
        f"cloned θ {after['reward'].mean():.3f} (ρ {rho_tr['reward'].mean():.3f}); "
        f"tilt AUC {tilt.auc:.3f} gap {tilt.gap:+.3f}  [{time.time() - t0:.0f}s]"
    )
    train_ratios = trajectory_log_ratios(s.policy, de[de["traj_id"].isin(set(tr["traj_id"]))])
    fit = tilt_report(tr["reward"], train_ratios.loc[tr["traj_id"]])
    print(f"training trajectories: tilt AUC {fit.auc:.3f} gap {fit.gap:+.3f} (in-sample)")


if __name__ == "__main__":
    main()
