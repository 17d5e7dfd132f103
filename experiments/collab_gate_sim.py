"""CollabFlow's evidence gate on the SIMULATED suite (docs/collabflow.md §2).

Two measurements:
1. evidence calibration: for each stateless profile's local episode (alone, and the verifier
   with one input candidate, the tool_user's), how often a correct and a wrong candidate
   carry evidence that scores it (ℓ ≥ 1): the gate can only help if correct candidates
   carry it more often;
2. the gate against its ablations on fixed teams, paired: every rule (``evidence``,
   ``verbatim`` = always adopt, ``always_revise``) runs each task under the same seed key, so
   the local episodes are the same draws and the rows differ only in what the gates did.
   Teams: ``researcher → solver`` (one_way, single(solver)) on the QA families, and on aime
   and mbpp_plus (the families whose verifier can run executable checks)
   ``tool_user →(final_only) verifier →(one_way) solver`` (single(solver): the evidence sits
   with the sender) and ``tool_user →(final_only) verifier ←(one_way) solver``
   (single(verifier): the evidence sits with the receiver).
Budget: the tiny-sim preset with ``method: collabflow`` (B_exec = total − B_con), or with
``--budget reference`` the reference episode limits (docs/method.md §1.3) with the same B_con.

Usage: python experiments/collab_gate_sim.py [--n 100] [--seeds 0 1 2]
       [--budget tiny|reference] [--no-calibration]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: experiments.*

from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.collabflow.communication import gate_summary
from evosteer_core.collabflow.construction import execution_limits
from evosteer_core.collabflow.evidence import GATE_RULES
from evosteer_core.collabflow.execution import execute_team
from evosteer_core.collabflow.team import BuildAction, Team, decode, default_profiles, team_spec
from evosteer_core.episode.budget import BudgetLedger, BudgetLimits
from evosteer_core.episode.records import TaskRecord
from evosteer_core.infra.config import CollabFlowConfig, RunConfig, default_config
from evosteer_core.sim import SimExecutor, make_sim_suite

QA = ("hotpotqa", "nq_open", "medqa")
CHECKED = ("aime", "mbpp_plus")
TEAMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "researcher>solver": (
        QA,
        (
            "add_agent(researcher)",
            "add_agent(solver)",
            "add_edge(researcher, solver, one_way)",
            "set_output(single, solver)",
        ),
    ),
    "tool_user>verifier>solver": (
        CHECKED,
        (
            "add_agent(tool_user)",
            "add_agent(verifier)",
            "add_agent(solver)",
            "add_edge(tool_user, verifier, final_only)",
            "add_edge(verifier, solver, one_way)",
            "set_output(single, solver)",
        ),
    ),
    "solver>verifier<tool_user": (
        CHECKED,
        (
            "add_agent(tool_user)",
            "add_agent(verifier)",
            "add_agent(solver)",
            "add_edge(tool_user, verifier, final_only)",
            "add_edge(solver, verifier, one_way)",
            "set_output(single, verifier)",
        ),
    ),
}


def collab_config(budget: str = "tiny") -> RunConfig:
    """The tiny-sim preset as a CollabFlow run; ``reference``: with the reference budget."""
    cfg = default_config()
    if budget == "reference":
        cfg = replace(cfg, budget=BudgetLimits())
    return replace(cfg, method="collabflow", collabflow=CollabFlowConfig())


def build(family: str, actions: Sequence[str]) -> Team:
    spec = team_spec(family, False, default_profiles())
    return decode([BuildAction.parse(a) for a in (*actions, "stop")], spec)


def run_team(cfg: RunConfig, team: Team, task: TaskRecord, seed: int, rule: str):
    """One execution of ``team`` on ``task`` under gate rule ``rule`` (key: seed, record)."""
    collab = replace(cfg.collabflow, gate=rule)
    spec = team_spec(task.family, False, default_profiles())
    ledger = BudgetLedger(execution_limits(cfg))
    return execute_team(team, spec, task, SimExecutor(), ledger, (seed, task.record_id), collab)


def calibration(cfg: RunConfig, n: int, seeds: Sequence[int]) -> list[tuple[str, str, int, int, float, float]]:
    """(family, profile, #correct, #wrong, P(ℓ≥1 | correct), P(ℓ≥1 | wrong)) of each
    stateless profile's local episode; ``verifier+input``: the verifier given the tool_user's
    candidate over a final_only edge."""
    rows = []
    for family in (*QA, *CHECKED):
        spec = team_spec(family, False, default_profiles())
        setups = [(p.profile_id, (f"add_agent({p.profile_id})",)) for p in spec.profiles]
        setups.append(
            (
                "verifier+input",
                (
                    "add_agent(tool_user)",
                    "add_agent(verifier)",
                    "add_edge(tool_user, verifier, final_only)",
                ),
            )
        )
        for name, acts in setups:
            agent = "verifier" if name == "verifier+input" else name
            team = build(family, (*acts, f"set_output(single, {agent})"))
            hits: dict[bool, list[bool]] = {True: [], False: []}
            for seed in seeds:
                for task in make_sim_suite(n, seed, "train"):
                    if task.family != family:
                        continue
                    h = run_team(cfg, team, task, seed, "evidence").holdings[agent]
                    right = evaluate(task, h.candidate.text or None) >= 1.0
                    hits[right].append(h.score >= 1)
            rows.append(
                (family, name, len(hits[True]), len(hits[False]), _mean(hits[True]), _mean(hits[False]))
            )
    return rows


def comparison(cfg: RunConfig, n: int, seeds: Sequence[int]) -> dict[str, dict[str, dict]]:
    """team → rule → {"acc": per-seed accuracies, "rewards": per-task rewards in a fixed
    order, "gates": every gate row, "stops": executions the budget stopped early}."""
    out: dict[str, dict[str, dict]] = {}
    for name, (families, acts) in TEAMS.items():
        out[name] = {}
        for rule in GATE_RULES:
            acc, rewards, gates, stops = [], [], [], 0
            for seed in seeds:
                tasks = [t for t in make_sim_suite(n, seed, "train") if t.family in families]
                seed_rewards = []
                for task in tasks:
                    o = run_team(cfg, build(task.family, acts), task, seed, rule)
                    seed_rewards.append(o.reward)
                    gates += o.gates
                    stops += o.stopped is not None
                acc.append(statistics.fmean(seed_rewards))
                rewards += seed_rewards
            out[name][rule] = {"acc": acc, "rewards": rewards, "gates": gates, "stops": stops}
    return out


def _mean(xs: Sequence[float | bool]) -> float:
    return statistics.fmean(xs) if xs else math.nan


def _se(xs: Sequence[float]) -> float:
    return statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else math.nan


def report(cal, comp, n: int, seeds: Sequence[int]) -> str:
    lines = [f"SIMULATED. n = {n} tasks per family per seed, seeds {list(seeds)}.", ""]
    lines += [
        "Evidence calibration (local episode; ℓ ≥ 1 = carries scoring evidence):",
        "",
        "| family | profile | correct | wrong | P(ℓ≥1 \\| correct) | P(ℓ≥1 \\| wrong) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {f} | {p} | {c} | {w} | {pc:.3f} | {pw:.3f} |" for f, p, c, w, pc, pw in cal]
    lines += [
        "",
        "Gate rules on fixed teams (accuracy: mean over seeds ± SE over seeds; Δ vs evidence: "
        "paired per task, mean ± SE over tasks):",
        "",
        "| team | rule | accuracy | Δ vs evidence | gates | adopt | keep | revise | "
        "budget stops | false adoption δ_C | revision error c_J | flip rate on C |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for team, rules in comp.items():
        base = rules["evidence"]["rewards"]
        for rule, r in rules.items():
            diffs = [a - b for a, b in zip(r["rewards"], base, strict=True)]
            s = gate_summary(r["gates"])
            lines.append(
                f"| {team} | {rule} | {_mean(r['acc']):.3f} ± {_se(r['acc']):.3f} | "
                f"{_mean(diffs):+.3f} ± {_se(diffs):.3f} | {s['gates']} | {s['adopt']} | "
                f"{s['keep']} | {s['revise']} | {r['stops']} | {_fmt(s['false_adoption'])} | "
                f"{_fmt(s['revision_error'])} | {_fmt(s['flip_rate'])} |"
            )
    return "\n".join(lines)


def _fmt(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100, help="tasks per family per seed")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budget", choices=("tiny", "reference"), default="tiny")
    p.add_argument("--no-calibration", action="store_true", help="only the gate comparison")
    args = p.parse_args()
    cfg = collab_config(args.budget)
    cal = [] if args.no_calibration else calibration(cfg, args.n, args.seeds)
    print(f"budget: {args.budget} (B_exec = {execution_limits(cfg).total_tokens})")
    print(report(cal, comparison(cfg, args.n, args.seeds), args.n, args.seeds))


if __name__ == "__main__":
    main()
