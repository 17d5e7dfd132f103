"""The testbed's per-family figures (SIMULATED; docs/testbed.md): fixed paradigms against the
reference ρ, with and without its warm start, on the held-out tasks under the config's budget
and simulator.

For every held-out task: each scripted paradigm of ``experiments/sim_paradigms.py`` (one
episode under the task's own key), and ``--runs`` episodes of ρ (the untrained policy,
adapter off, temperature ``policy.temperature``) as configured (``policy.init`` warm start) and,
with ``--random-init``, of ρ on the backbone's own weights. Prints the mean reward per
family, the best row of each family, and whether any family is won by nothing.

Usage: python experiments/testbed.py [--config configs/table2-sim.yaml] [--runs 2]
       [--random-init] [--heldout 16] [--threads 1] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: experiments.*

from evosteer_core.episode.records import FAMILIES
from evosteer_core.evaluation.rollouts import evaluation_rollouts
from experiments.probe_session import add_session_options, untrained_session
from experiments.sim_paradigms import PARADIGMS, family_means


def rho_row(args: argparse.Namespace) -> dict[str, float]:
    """ρ's mean held-out reward per family for the session the options describe."""
    s = untrained_session(args)
    trajectories, _ = evaluation_rollouts(s, s.world.heldout_records, False, args.runs, "testbed")
    return trajectories.groupby("family")["reward"].mean().to_dict()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2, help="ρ episodes per held-out task")
    p.add_argument("--random-init", action="store_true", help="also ρ without the warm start")
    add_session_options(p)
    args = p.parse_args()
    if args.config is None:
        args.config = str(Path(__file__).resolve().parents[1] / "configs" / "table2-sim.yaml")
    t0 = time.time()
    s = untrained_session(args)
    cfg, records = s.cfg, s.world.heldout_records
    table: dict[str, dict[str, float]] = {}
    for name, paradigm in PARADIGMS.items():
        if name != "random":
            table[name] = family_means(
                paradigm, records, cfg.train.seed, cfg.budget, s.world.executor
            )
    table["ρ (policy.init)" if cfg.policy.init else "ρ"] = rho_row(args)
    if args.random_init and cfg.policy.init is not None:
        args.set = [*args.set, "policy.init=null"]
        table["ρ (random init)"] = rho_row(args)
    print(
        f"SIMULATED: {args.config}, {len(records)} held-out tasks, k = "
        f"{cfg.sim.orchestration_effect:g}, ρ {args.runs} runs a task  [{time.time() - t0:.0f}s]"
    )
    header = f"| {'row':<17} | " + " | ".join(f"{f:>9}" for f in FAMILIES) + " |  mean |"
    print(header)
    print("|" + "---|" * (len(FAMILIES) + 2))
    for name, row in table.items():
        cells = " | ".join(f"{row[f]:>9.3f}" for f in FAMILIES)
        print(f"| {name:<17} | {cells} | {statistics.fmean(row.values()):.3f} |")
    fixed = [n for n in table if n in PARADIGMS]
    best = {f: max(fixed, key=lambda n, f=f: table[n][f]) for f in FAMILIES}
    print("best paradigm per family: " + ", ".join(f"{f}={n}" for f, n in best.items()))
    print(f"no paradigm best on every family: {len(set(best.values())) > 1}")
    unwon = [f for f in FAMILIES if max(row[f] for row in table.values()) == 0]
    print(f"families no row wins: {unwon or 'none'}")


if __name__ == "__main__":
    main()
