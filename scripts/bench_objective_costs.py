"""The objective comparison's cost table (paper Fig. 6a's cost columns) on tiny-sim.

Runs the same in-process training loop (same config, same seeds) once per objective with
``objectives.cost_metrics`` on, and prints per objective the means over the steps of:
  * update ms / episode : the update's wall time (loss, every backward pass incl. PPO's critic
                          and GRPO's KL term, clipping, the AdamW step) over trained episodes;
  * s / step            : wall time of the whole step (rollout, re-score, heads, update,
                          validation, checkpoint);
  * tokens / problem    : the rollout's tokens (every episode of the step) over its records;
and the mean θ reward and final loss (SIMULATED numbers; a few steps say nothing about learning).

Run: ``python scripts/bench_objective_costs.py [--steps 2] [--threads 1] [--set key=value ...]``
(defaults: tests/pipeline_support.py's smallest tiny-sim sizes with 2 θ rollouts per record,
the group GRPO needs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from evosteer_core.episode.world import build_world
from evosteer_core.infra.config import load_config
from evosteer_core.objectives import objective_names
from evosteer_core.training.loop import train_step
from evosteer_core.training.session import init_state, open_session

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pipeline_support import SMALL

ORDER = ("ppo", "grpo", "tb", "tempered_tb", "anchortb")


def run(name: str, steps: int, overrides: dict) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as root:
        cfg = load_config(
            None,
            {
                **overrides,
                "store.root": root,
                "train.objective": name,
                "objectives.cost_metrics": True,
            },
        )
        state, world = init_state(cfg), build_world(cfg)
        rows = []
        for step in range(1, steps + 1):
            started = time.perf_counter()
            state, metrics = train_step(open_session(cfg, state, world), state, step)
            rows.append({**metrics, "step_s": time.perf_counter() - started})
    mean = {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}
    mean["loss"] = rows[-1]["loss"]
    return mean


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--objectives", nargs="*", default=list(ORDER), choices=objective_names())
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    overrides = {**SMALL, "train.rollouts_theta": 2}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value)
    print(f"tiny-sim, {args.steps} steps, {args.threads} thread(s); overrides {overrides}")
    print("| objective | update ms / episode | s / step | tokens / problem | reward θ | loss |")
    print("|---|---|---|---|---|---|")
    for name in args.objectives:
        m = run(name, args.steps, overrides)
        print(
            f"| {name} | {m['update_ms_per_episode']:.1f} | {m['step_s']:.1f} | "
            f"{m['tokens_per_problem']:,.0f} | {m['reward_theta']:.3f} | {m['loss']:.4f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
