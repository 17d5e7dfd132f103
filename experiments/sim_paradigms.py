"""Mean reward per family of fixed orchestration paradigms on the SIMULATED suite.

Paradigms (all driven through ``evosteer_core.episode.runtime.Episode``):
- single: one solver, set as output, stop;
- chain: solver n0, verifier n1, revise edge n0->n1, output n1, stop;
- chain+rerun: the chain; if n0 and n1 disagree, rerun n0 then n1 (n1 re-checks the fresh
  draw against its own previous answer), stop;
- random: uniformly random legal actions until STOP (or the action cap) ends the episode.
In the interactive family STOP is illegal while the game runs, so every paradigm reruns its
output node until STOP is legal. Every paradigm runs a task under the same episode key, so
node n0's first execution is the same draw in all of them (common random numbers): the
differences between rows come from orchestration, not from sampling noise in n0.

Usage: python experiments/sim_paradigms.py [--n 200] [--seed 0] [--split train]
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Callable

from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.episode.actions import Action
from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.episode.records import FAMILIES, TaskRecord
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.episode.runtime import Episode
from evosteer_core.infra.seeding import derive_seed
from evosteer_core.sim import SimExecutor, make_sim_suite

Paradigm = Callable[[Episode], None]


def _finish(ep: Episode) -> None:
    """Rerun the output node while STOP is not legal (interactive game still running)."""
    while not ep.stopped:
        legal = ep.legal_actions()
        if Action("STOP") in legal:
            ep.apply(Action("STOP"))
        elif (rerun := Action("RERUN_AGENT", node_id=ep.graph.output_id)) in legal:
            ep.apply(rerun)
        else:
            ep.apply(legal[0])  # the runtime's finalizing action once the budget is spent


def single(ep: Episode) -> None:
    ep.apply(Action("ADD_AGENT", node_id="n0", role_id="solver"))
    ep.apply(Action("SET_OUTPUT", node_id="n0"))
    _finish(ep)


def _chain(ep: Episode) -> None:
    ep.apply(Action("ADD_AGENT", node_id="n0", role_id="solver"))
    ep.apply(Action("ADD_AGENT", node_id="n1", role_id="verifier"))
    ep.apply(Action("ADD_EDGE", source_id="n0", target_id="n1", protocol="revise"))
    ep.apply(Action("SET_OUTPUT", node_id="n1"))


def chain(ep: Episode) -> None:
    _chain(ep)
    _finish(ep)


def chain_rerun(ep: Episode) -> None:
    _chain(ep)
    nodes = ep.graph.nodes
    if nodes["n0"].answer != nodes["n1"].answer:
        for nid in ("n0", "n1"):
            act = Action("RERUN_AGENT", node_id=nid)
            if act in ep.legal_actions():
                ep.apply(act)
    _finish(ep)


def random_graph(ep: Episode) -> None:
    rng = random.Random(derive_seed(ep.run_seed, ep.episode_key, "random-paradigm"))
    while not ep.stopped:
        legal = ep.legal_actions()
        ep.apply(legal[rng.randrange(len(legal))])


PARADIGMS: dict[str, Paradigm] = {
    "single": single,
    "chain": chain,
    "chain+rerun": chain_rerun,
    "random": random_graph,
}


def run_paradigm(
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
        paradigm(ep)
        rewards[task.family].append(float(ep.reward))
    return {f: statistics.fmean(r) for f, r in rewards.items() if r}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="tasks per family")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="train")
    args = parser.parse_args()
    tasks = make_sim_suite(args.n, args.seed, args.split)
    table = {name: run_paradigm(p, tasks, args.seed) for name, p in PARADIGMS.items()}
    print(
        f"SIMULATED suite: mean reward per family, {args.n} evosteer_flyte/tasks/family, seed {args.seed}"
    )
    header = f"| {'paradigm':<12} | " + " | ".join(f"{f:>9}" for f in FAMILIES) + " |   mean |"
    print(header)
    print("|" + "-" * (len(header) - 2) + "|")
    for name, row in table.items():
        cells = " | ".join(f"{row[f]:>9.3f}" for f in FAMILIES)
        print(f"| {name:<12} | {cells} | {statistics.fmean(row.values()):.3f} |")
    best = {f: max(table, key=lambda p, f=f: table[p][f]) for f in FAMILIES}
    print("best per family: " + ", ".join(f"{f}={p}" for f, p in best.items()))
    fixed = ("chain", "chain+rerun")
    beats = all(max(table[p][f] for p in fixed) > table["single"][f] for f in FAMILIES)
    print(f"best fixed paradigm beats single on every family: {beats}")
    print(f"no paradigm best on all families: {len(set(best.values())) > 1}")


if __name__ == "__main__":
    main()
