"""Throughput of the SIMULATED executor: node calls, episodes per second, feature time.

Prints: microseconds per sim node call (executor only), episodes per second through the
runtime for single-agent and solver->verifier chain episodes, and, when
``evosteer_core.episode.features`` exists, the time of one ``execution_features`` call.

Usage: python scripts/bench_sim.py [--n 100]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: experiments.*

from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.episode.runtime import Episode
from evosteer_core.sim import SimExecutor, make_sim_suite
from experiments.sim_paradigms import PARADIGMS


def _episodes(paradigm, tasks, executor, catalogue, limits) -> list[Episode]:
    eps = []
    for task in tasks:
        ep = Episode(
            task, catalogue, limits, executor, evaluate, run_seed=1, episode_key=task.record_id
        )
        paradigm.run(ep)
        eps.append(ep)
    return eps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="tasks per family")
    args = parser.parse_args()
    tasks = make_sim_suite(args.n, 0, "bench")
    executor, catalogue, limits = SimExecutor(), default_catalogue(), BudgetLimits()

    calls: dict[str, list[float]] = {"question": [], "interactive": []}
    run_node = executor.run_node

    def timed(request):
        t0 = time.perf_counter()
        out = run_node(request)
        kind = "interactive" if request.environment is not None else "question"
        calls[kind].append(time.perf_counter() - t0)
        return out

    executor.run_node = timed  # type: ignore[method-assign]
    print(f"SIMULATED executor benchmark, {len(tasks)} tasks ({args.n} per family)")
    episodes: list[Episode] = []
    for name, paradigm in (
        ("single-agent", PARADIGMS["single"]),
        ("solver->verifier chain", PARADIGMS["chain"]),
    ):
        t0 = time.perf_counter()
        episodes = _episodes(paradigm, tasks, executor, catalogue, limits)
        dt = time.perf_counter() - t0
        print(
            f"{name:>24}: {len(tasks) / dt:8.1f} episodes/s ({1e3 * dt / len(tasks):.2f} ms each)"
        )
    for kind, times in calls.items():
        label = f"sim node call ({kind})"
        print(f"{label:>24}: {1e6 * sum(times) / len(times):8.1f} us mean over {len(times)}")

    if importlib.util.find_spec("evosteer_core.episode.features") is None:
        print("feature extraction: skipped (evosteer_core.episode.features is not there yet)")
        return
    from evosteer_core.episode.features import execution_features

    t0 = time.perf_counter()
    for ep in episodes:
        execution_features(ep)
    dt = time.perf_counter() - t0
    print(f"{'execution_features':>24}: {1e6 * dt / len(episodes):8.1f} us per call")


if __name__ == "__main__":
    main()
