"""How much θ can gain over ρ at temperature 1: the reward-tilt bound of Proposition A.6.

AnchorTB's target is the tilted law P*(x) ∝ P_ρ(x)(1 + a_β r(x)), a_β = e^β − 1. For a fixed
executor the policy can only tilt its own actions, so what it can reach on a task C is
ρ's action sequences reweighted by 1 + a_β p(τ), p(τ) = the success probability of the action
sequence τ. The mean reward then rises by (A.6 with the executor's noise averaged out)

    gain_C = a_β · Var_ρ(p | C) / (1 + a_β · μ_C),    μ_C = E_ρ[p | C].

This script estimates it on held-out SIMULATED tasks: it samples ``--rollouts`` ρ trajectories
per task (the untrained policy, temperature 1), replays each action sequence open-loop under
``--replays`` fresh executor seeds to estimate p(τ) (charging the orchestrator tokens the
decision cost), removes the binomial noise of the estimate from the variance, and prints the
per-family and mean bound for several β. Open-loop replay approximates p(τ) of an adaptive
policy; an action that is illegal in a replay ends it with the runtime's finalizing actions.

Usage: python experiments/tilt_ceiling.py [--heldout 16] [--rollouts 4] [--replays 8] [--betas 2 4 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: experiments.*

from evosteer_core.episode.rollout import EpisodePlan
from evosteer_core.episode.runtime import DecisionCharge, Episode, replay_open_loop
from evosteer_core.evaluation.rollouts import evaluation_rollouts
from experiments.probe_session import add_session_options, untrained_session
from experiments.tilt import success_variance, tilt_gain


def sampled_cost(s, prompt: str, action_tokens: int) -> DecisionCharge:
    """What a sampled decision is charged in a sim rollout: its tokens and simulated time."""
    prompt_tokens = s.policy.count_tokens(prompt)
    seconds = s.world.executor.decision_seconds(prompt_tokens, action_tokens)
    return DecisionCharge(prompt_tokens, action_tokens, seconds)


def replay_reward(s, record, actions: list[str], costs: list[DecisionCharge], key: str) -> float:
    """Reward of the action sequence ``actions`` run open-loop under executor key ``key``, each
    decision charged as the rollout charged it (``runtime.replay_open_loop``)."""
    ep = Episode(
        record,
        s.world.catalogue,
        s.cfg.budget,
        s.world.executor,
        s.world.evaluator,
        menu=(),
        run_seed=s.cfg.train.seed,
        episode_key=key,
    )
    return replay_open_loop(ep, actions, costs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rollouts", type=int, default=4, help="ρ trajectories per task")
    p.add_argument("--replays", type=int, default=8, help="executor draws per trajectory")
    p.add_argument("--betas", type=float, nargs="+", default=[2.0, 4.0, 8.0])
    add_session_options(p)
    args = p.parse_args()
    s = untrained_session(args)
    records = s.world.heldout_records
    plans = [
        EpisodePlan(r, "rho", k, evaluation=True) for r in records for k in range(args.rollouts)
    ]
    trajectories, decisions = evaluation_rollouts(s, records, False, args.rollouts, "ceiling")
    by_traj = dict(tuple(decisions.groupby("traj_id", sort=False)))
    tok = s.policy.policy.tokenizer
    p_hat: dict[str, list[float]] = {}
    family = {r.record_id: r.family for r in records}
    for plan in plans:
        d = by_traj[plan.traj_id]
        costs = [
            DecisionCharge() if forced else sampled_cost(s, pr, len(tok.encode_action(a)))
            for pr, a, forced in zip(d["prompt"], d["action"], d["forced"], strict=True)
        ]
        rewards = [
            replay_reward(s, plan.record, list(d["action"]), costs, f"{plan.traj_id}/replay{k}")
            for k in range(args.replays)
        ]
        p_hat.setdefault(plan.record.record_id, []).append(float(np.mean(rewards)))
    k = args.replays
    print(
        f"SIMULATED executor, untrained ρ (temperature 1): {len(records)} held-out tasks, "
        f"{args.rollouts} trajectories each, {k} replays per trajectory; "
        f"natural ρ reward {trajectories['reward'].mean():.3f}"
    )
    rows = []
    for record_id, ps in p_hat.items():
        rows.append((family[record_id], float(np.mean(ps)), success_variance(ps, k)))
    header = "| family | μ (replayed) | Var_ρ(p) | " + " | ".join(
        f"gain β={b:g}" for b in args.betas
    )
    print(header + " |")
    print("|" + "---|" * (3 + len(args.betas)))
    families = sorted({f for f, _, _ in rows}, key=lambda f: list(family.values()).index(f))
    for fam in [*families, "mean"]:
        sel = [r for r in rows if fam in ("mean", r[0])]
        cells = []
        for b in args.betas:
            cells.append(f"{np.mean([tilt_gain(mu, var, b) for _, mu, var in sel]):+.3f}")
        mu = np.mean([m for _, m, _ in sel])
        var = np.mean([v for _, _, v in sel])
        print(f"| {fam} | {mu:.3f} | {var:.4f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
