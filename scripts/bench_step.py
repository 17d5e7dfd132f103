"""Time one full training step and each of its stages (docs/method.md §1.9) on this machine.

Usage: python scripts/bench_step.py [--batch 32] [--rollouts 2] [--threads 2] [--config FILE]
Prints the stage times (rollout, rescore, value fit, AnchorTB update, validation round,
checkpoint), the number of trajectories and decisions, and decisions per second. The default
is the paper's batch shape (32 records, 2θ + 2ρ rollouts) on the tiny backbone and the
SIMULATED executor. See also scripts/bench_policy.py (sampling/scoring rates) and
scripts/bench_objectives.py (AnchorTB O(T) vs explicit span sums).
"""

from __future__ import annotations

import argparse
import time

import torch

from evosteer_core.infra.config import load_config
from evosteer_core.training.session import init_state, open_session
from evosteer_core.training.stages import (
    checkpoint_stage,
    rescore_stage,
    rollout_stage,
    validation_stage,
    value_stage,
)
from evosteer_core.training.update import update_stage


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", default=None)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rollouts", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--step", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(
        args.config,
        overrides={
            "train.batch_size": args.batch,
            "train.rollouts_theta": args.rollouts,
            "train.rollouts_rho": args.rollouts,
        },
    )
    t0 = time.perf_counter()
    state = init_state(cfg)
    s = open_session(cfg, state)
    times = {"setup": time.perf_counter() - t0}

    def timed(name, fn, *a):
        t = time.perf_counter()
        out = fn(*a)
        times[name] = time.perf_counter() - t
        return out

    rollouts = timed("rollout", rollout_stage, s, args.step)
    trajectories, decisions = rollouts.trajectories, rollouts.decisions
    rescored = timed("rescore", rescore_stage, s, decisions)
    value = timed("value", value_stage, s, rollouts, rescored, state.value_window)
    upd = timed("update", update_stage, s, rollouts, rescored, state.actor_optimizer)
    validation = timed("validation", validation_stage, s, rollouts, args.step)
    timed(
        "checkpoint",
        lambda: checkpoint_stage(
            state, args.step, value, upd, validation, seed=cfg.train.seed
        ).to_bytes(),
    )
    step_total = sum(t for k, t in times.items() if k != "setup")
    print(
        f"records {args.batch}, rollouts {args.rollouts}θ+{args.rollouts}ρ, "
        f"threads {args.threads}: {len(trajectories)} trajectories, {len(decisions)} decisions, "
        f"mean prompt chars {decisions['prompt'].str.len().mean():.0f}"
    )
    for name, t in times.items():
        share = "" if name == "setup" else f"  ({100 * t / step_total:4.1f}%)"
        print(f"  {name:17s} {t:8.2f} s{share}")
    print(
        f"  {'step total':17s} {step_total:8.2f} s   "
        f"({len(decisions) / step_total:.1f} decisions/s end to end)"
    )


if __name__ == "__main__":
    main()
