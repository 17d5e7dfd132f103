"""How far stored checkpoints have tilted from ρ, measured on ρ's own trajectories.

Usage: python experiments/checkpoint_tilt.py --store STORE --run RUN [--run RUN ...]
       [--step N ...] [--split heldout|train] [--runs 2] [--threads 2]

Everything here is SIMULATED when the runs are. For each run and step, ρ's trajectories on
every record of the split (``--runs`` runs each, the evaluation seeds and the checkpoint's
deployed menus) are scored by that step's θ: the per-trajectory log-ratio w = Σ_t Δℓ_t gives
the tilt report (AUC and gap between successes and failures, experiments/tilt.py) and the
reweighted gain (θ's mean reward − ρ's, estimated from the same episodes, with its standard
error). Training records show whether θ fitted its target where it was trained, held-out ones
whether that carries over. docs/table2_sim.md ("Why the adapter's tilt stays small") has the
figures of the table2-sim runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: experiments.*

from evosteer_core.episode.world import build_world
from evosteer_core.evaluation.rollouts import evaluation_rollouts
from evosteer_core.infra.artifacts import MissingArtifactError
from evosteer_core.training.session import open_session
from experiments.probe_session import stored_checkpoint
from experiments.tilt import reweighted_gain, tilt_report, trajectory_log_ratios


def checkpoint_tilt(store: str, run: str, step: int | None, split: str, runs: int) -> dict:
    """The tilt report and reweighted gain of ``run``'s θ at ``step`` on ρ's ``split`` episodes."""
    cfg, state, at = stored_checkpoint(store, run, step)
    world = build_world(cfg)
    records = world.heldout_records if split == "heldout" else world.train_records
    s = open_session(cfg, state, world)
    rho, decisions = evaluation_rollouts(s, records, False, runs, f"tilt-{split}")
    w = trajectory_log_ratios(s.policy, decisions).loc[rho["traj_id"]]
    tilt = tilt_report(rho["reward"], w)
    gain = reweighted_gain(rho["reward"], w)
    return {
        "run": run,
        "step": at,
        "seed": cfg.train.seed,
        "episodes": len(rho),
        "rho": float(rho["reward"].mean()),
        "auc": tilt.auc,
        "gap": tilt.gap,
        "gain": gain.gain,
        "se": gain.se,
        "mean_abs_w": float(w.abs().mean()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--store", required=True, help="the store root the runs live in")
    p.add_argument("--run", action="append", required=True, help="a run id (repeatable)")
    p.add_argument("--step", type=int, action="append", help="a step (repeatable; default: last)")
    p.add_argument("--split", choices=("heldout", "train"), default="heldout")
    p.add_argument("--runs", type=int, default=2, help="ρ runs per record")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for run in args.run:
        for step in args.step or [None]:
            try:
                r = checkpoint_tilt(args.store, run, step, args.split, args.runs)
            except MissingArtifactError as exc:  # a run id or step the store does not hold
                sys.exit(f"checkpoint_tilt: {exc}")
            print(
                f"{run} step {r['step']} seed {r['seed']} ({args.split}, {r['episodes']} ρ "
                f"episodes, ρ {r['rho']:.3f}): tilt AUC {r['auc']:.3f} gap {r['gap']:+.4f} nats, "
                f"mean |w| {r['mean_abs_w']:.4f}, reweighted gain {r['gain']:+.4f} ± {r['se']:.4f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
