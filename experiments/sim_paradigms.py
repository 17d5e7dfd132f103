"""Mean reward per family of fixed orchestration paradigms on the SIMULATED suite.

Paradigms (all driven through ``evosteer_core.episode.runtime.Episode``; the library ones are
described in docs/paradigms.md):
- single: one solver, set as output, stop (the library's ``direct``);
- chain: solver n0, verifier n1, revise edge n0->n1, output n1, stop;
- chain+rerun: the chain; if n0 and n1 disagree, rerun n0 then n1 (n1 re-checks the fresh
  draw against its own previous answer), stop;
- random: uniformly random legal actions until STOP (or the action cap) ends the episode;
- react, template, plan_execute: the library's paradigms of those names.
In the interactive family STOP is illegal while the game runs, so every paradigm reruns its
output node until STOP is legal (``paradigms.base.finish``). Every paradigm runs a task under
the same episode key, so node n0's first execution is the same draw in all of them (common
random numbers): the differences between rows come from orchestration, not from sampling
noise in n0.

Usage: python experiments/sim_paradigms.py [--n 200] [--seed 0] [--split train]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.episode.actions import Action
from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.episode.records import FAMILIES, TaskRecord
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.episode.runtime import Episode
from evosteer_core.paradigms.base import (
    Paradigm,
    ScriptedParadigm,
    apply_script,
    chain_script,
    finish,
)
from evosteer_core.paradigms.direct import DIRECT
from evosteer_core.paradigms.plan_execute import PLAN_EXECUTE
from evosteer_core.paradigms.random_legal import RANDOM
from evosteer_core.paradigms.react import REACT
from evosteer_core.paradigms.template import TEMPLATE
from evosteer_core.sim import SimExecutor, make_sim_suite

CHAIN_SCRIPT = chain_script(["solver", "verifier"])
CHAIN = ScriptedParadigm("chain", lambda view: CHAIN_SCRIPT)


@dataclass(frozen=True)
class ChainRerun:
    """The chain; on disagreement between solver and verifier, rerun both once."""

    name: str = "chain+rerun"

    def run(self, ep: Episode) -> None:
        apply_script(ep, CHAIN_SCRIPT)
        nodes = ep.graph.nodes
        if nodes["n0"].answer != nodes["n1"].answer:
            for nid in ("n0", "n1"):
                act = Action("RERUN_AGENT", node_id=nid)
                if act in ep.legal_actions():
                    ep.apply(act)
        finish(ep)


PARADIGMS: dict[str, Paradigm] = {
    "single": DIRECT,
    "chain": CHAIN,
    "chain+rerun": ChainRerun(),
    "random": RANDOM,
    "react": REACT,
    "template": TEMPLATE,
    "plan_execute": PLAN_EXECUTE,
}


def family_means(
    paradigm: Paradigm,
    tasks: list[TaskRecord],
    seed: int,
    limits: BudgetLimits | None = None,
    executor: SimExecutor | None = None,
) -> dict[str, float]:
    """Mean reward per family of ``paradigm`` over ``tasks`` (one episode per task)."""
    catalogue = default_catalogue()
    executor = executor or SimExecutor()
    limits = limits or BudgetLimits()
    rewards: dict[str, list[float]] = {f: [] for f in FAMILIES}
    for task in tasks:
        ep = Episode(
            task,
            catalogue,
            limits,
            executor,
            evaluate,
            run_seed=seed,
            episode_key=task.record_id,
        )
        paradigm.run(ep)
        rewards[task.family].append(float(ep.reward))
    return {f: statistics.fmean(r) for f, r in rewards.items() if r}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="tasks per family")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="train")
    args = parser.parse_args()
    tasks = make_sim_suite(args.n, args.seed, args.split)
    table = {name: family_means(p, tasks, args.seed) for name, p in PARADIGMS.items()}
    print(f"SIMULATED suite: mean reward per family, {args.n} tasks/family, seed {args.seed}")
    header = f"| {'paradigm':<12} | " + " | ".join(f"{f:>9}" for f in FAMILIES) + " |   mean |"
    print(header)
    print("|" + "-" * (len(header) - 2) + "|")
    for name, row in table.items():
        cells = " | ".join(f"{row[f]:>9.3f}" for f in FAMILIES)
        print(f"| {name:<12} | {cells} | {statistics.fmean(row.values()):.3f} |")
    best = {f: max(table, key=lambda p, f=f: table[p][f]) for f in FAMILIES}
    print("best per family: " + ", ".join(f"{f}={p}" for f, p in best.items()))
    fixed = ("chain", "chain+rerun", "template", "plan_execute")
    beats = all(max(table[p][f] for p in fixed) > table["single"][f] for f in FAMILIES)
    print(f"best fixed paradigm beats single on every family: {beats}")
    print(f"no paradigm best on all families: {len(set(best.values())) > 1}")


if __name__ == "__main__":
    main()
