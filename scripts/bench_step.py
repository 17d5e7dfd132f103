"""Time one full training step and each of its stages (docs/method.md §1.9) on this machine.

Usage: python scripts/bench_step.py [--batch 32] [--rollouts 2] [--threads 2] [--config FILE]
                                    [--after K] [--rounds | --vs REV [--runs 3]] [--json]
Prints the stage times (rollout, rescore, value fit, actor update, validation round,
checkpoint; wall and CPU seconds), the number of trajectories and decisions, and decisions per
second. ``--rounds`` also splits the rollout into its lock-step rounds (``episode/rollout.py``):
per round, the episodes still pending, the seconds the orchestrator spent deciding for them
(the batched policy calls) and the seconds until the next round's decisions began (their
actions: node executions, with a real executor the model server's replies). The default is
the paper's batch shape (32 records, 2θ + 2ρ rollouts) on the tiny backbone and the SIMULATED
executor. Step 1 has no skills yet; ``--after K`` trains K steps first and times step K+1,
whose episodes see the candidate skills on their menus and whose batch carries their paired
arms, as most steps of a long run do.

``--vs REV`` times the code in this checkout and git revision REV side by side: REV is
checked out into a temporary worktree (removed afterwards; REV may also be a folder holding
a checkout, used as it is), and each of ``--runs`` rounds runs
one fresh process per side, alternating, each timing the same step with *its own* code (the
script's measuring part knows both the current package layout and the one before the
``training/`` restructuring). It prints each stage's median for both and the median of the
per-round ratios (this / REV): absolute times on a shared machine drift, ratios of
neighbouring runs much less. See docs/performance.md. See also scripts/bench_policy.py
(sampling/scoring rates) and scripts/bench_objectives.py (AnchorTB O(T) vs explicit sums).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STAGES = (
    "rollout_stage",
    "rescore_stage",
    "value_stage",
    "update_stage",
    "validation_stage",
    "checkpoint_stage",
)
"""The stage functions a step calls, by the names both package layouts use."""


def _layout() -> tuple[Any, Any, Any, Any]:
    """(load_config, init_state, open_session, the module whose train_step runs the stages) of
    the evosteer_core on the path: the training/ package, or the older single step.py."""
    try:
        from evosteer_core.infra.config import load_config
        from evosteer_core.training.session import init_state, open_session

        step_module = importlib.import_module("evosteer_core.training.loop")
    except ModuleNotFoundError:
        from evosteer_core.config import load_config  # type: ignore[no-redef]
        from evosteer_core.step import init_state, open_session  # type: ignore[no-redef]

        step_module = importlib.import_module("evosteer_core.step")
    return load_config, init_state, open_session, step_module


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Set up a session and time one step, stage by stage (wall and CPU seconds)."""
    import torch

    torch.set_num_threads(args.threads)
    load_config, init_state, open_session, step_module = _layout()
    cfg = load_config(
        args.config,
        overrides={
            "train.batch_size": args.batch,
            "train.rollouts_theta": args.rollouts,
            "train.rollouts_rho": args.rollouts,
        },
    )
    wall, cpu = time.perf_counter(), time.process_time()
    state = init_state(cfg)
    for step in range(1, args.after + 1):  # untimed: the state the timed step starts from
        out = step_module.train_step(open_session(cfg, state), state, step)
        state = out[0] if isinstance(out, tuple) else out
    s = open_session(cfg, state)
    times = {"setup": (time.perf_counter() - wall, time.process_time() - cpu)}
    seen: dict[str, Any] = {}

    def timed(name: str, fn: Any) -> Any:
        def run(*a: Any, **kw: Any) -> Any:
            w, c = time.perf_counter(), time.process_time()
            out = fn(*a, **kw)
            times[name.removesuffix("_stage")] = (time.perf_counter() - w, time.process_time() - c)
            if name == "rollout_stage":
                seen["decisions"] = out.decisions if hasattr(out, "decisions") else out[1]
            return out

        return run

    for name in STAGES:
        setattr(step_module, name, timed(name, getattr(step_module, name)))
    rounds = _time_rounds() if args.rounds else {}
    wall, cpu = time.perf_counter(), time.process_time()
    step_module.train_step(s, state, args.after + 1 if args.after else args.step)
    times["step total"] = (time.perf_counter() - wall, time.process_time() - cpu)
    decisions = seen["decisions"]
    extra = {"rounds": _round_split(rounds)} if args.rounds else {}
    return {
        "package": str(
            Path(importlib.import_module("evosteer_core").__file__).resolve().parents[1]
        ),
        "decisions": len(decisions),
        "trajectories": int(decisions["traj_id"].nunique()),
        "prompt_chars": float(decisions["prompt"].str.len().mean()),
        "wall": {k: w for k, (w, _) in times.items()},
        "cpu": {k: c for k, (_, c) in times.items()},
        **extra,
    }


def _time_rounds() -> dict[str, list]:
    """Wrap the rollout's per-round decision function and its round loop; returns the lists
    they fill: ``choose`` one (decisions, start, end) per round and ``ends`` one end time per
    rollout, in call order (the training rollout first, then the validation round's)."""
    rollout = importlib.import_module("evosteer_core.episode.rollout")
    calls: dict[str, list] = {"choose": [], "ends": []}
    choose, run_rounds = rollout._choose, rollout._run_rounds

    def timed_choose(policy: Any, decisions: list[dict], *a: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        out = choose(policy, decisions, *a, **kw)
        calls["choose"].append((len(decisions), start, time.perf_counter()))
        return out

    def timed_rounds(*a: Any, **kw: Any) -> Any:
        out = run_rounds(*a, **kw)
        calls["ends"].append(time.perf_counter())
        return out

    rollout._choose, rollout._run_rounds = timed_choose, timed_rounds
    return calls


def _round_split(calls: dict[str, list]) -> list[dict]:
    """The training rollout's rounds: episodes pending, seconds deciding, and seconds acting
    (from the end of a round's decisions to the next round's start, or to the last round's
    end)."""
    end = calls["ends"][0]
    rounds = [c for c in calls["choose"] if c[2] <= end]
    nexts = [c[1] for c in rounds[1:]] + [end]
    return [
        {"episodes": n, "decide_s": stop - start, "act_s": nxt - stop}
        for (n, start, stop), nxt in zip(rounds, nexts, strict=True)
    ]


def print_one(args: argparse.Namespace, r: dict[str, Any]) -> None:
    print(
        f"records {args.batch}, rollouts {args.rollouts}θ+{args.rollouts}ρ, threads "
        f"{args.threads}: {r['trajectories']} trajectories, {r['decisions']} decisions, mean "
        f"prompt chars {r['prompt_chars']:.0f}"
    )
    total = r["wall"]["step total"]
    for name, t in r["wall"].items():
        share = "" if name in ("setup", "step total") else f"  ({100 * t / total:4.1f}%)"
        print(f"  {name:12s} {t:8.2f} s wall {r['cpu'][name]:8.2f} s cpu{share}")
    print(f"  {r['decisions'] / total:.1f} decisions/s end to end")
    if "rounds" in r:
        rounds = r["rounds"]
        decide = sum(x["decide_s"] for x in rounds)
        act = sum(x["act_s"] for x in rounds)
        print(f"  rollout rounds {len(rounds)}: deciding {decide:.2f} s, acting {act:.2f} s")
        for k, x in enumerate(rounds, 1):
            print(
                f"    round {k:3d}: {x['episodes']:3d} episodes, decide {x['decide_s']:7.2f} s,"
                f" act {x['act_s']:7.2f} s"
            )


def _one_args(args: argparse.Namespace) -> list[str]:
    out = ["--batch", str(args.batch), "--rollouts", str(args.rollouts)]
    out += ["--threads", str(args.threads), "--step", str(args.step), "--json"]
    out += ["--after", str(args.after)]
    return out + (["--config", str(Path(args.config).resolve())] if args.config else [])


def _run_in(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One fresh process timing a step with the package in ``tree`` (its own code)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *_one_args(args)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"bench in {tree} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if Path(result["package"]) != tree.resolve():
        sys.exit(f"the bench in {tree} imported the package from {result['package']}")
    return result


def side_by_side(args: argparse.Namespace) -> None:
    """Alternate this checkout and ``args.vs`` (a git revision, checked out into a temporary
    worktree, or a folder holding a checkout), then print medians and ratios."""
    given = Path(args.vs)
    if given.is_dir():
        runs = _alternate(args, given.name, given.resolve())
        print_comparison(args, given.name, runs)
        return
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.vs],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tree = Path(tempfile.mkdtemp(prefix=f"bench-vs-{rev}-")) / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree), rev],
        check=True,
    )
    try:
        runs = _alternate(args, rev, tree)
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False
        )
        tree.parent.rmdir()
    print_comparison(args, rev, runs)


def _alternate(args: argparse.Namespace, name: str, tree: Path) -> dict[str, list[dict[str, Any]]]:
    """``args.runs`` rounds of one process here, then one in ``tree``."""
    runs: dict[str, list[dict[str, Any]]] = {"this": [], name: []}
    for k in range(args.runs):
        for side, where in (("this", ROOT), (name, tree)):
            runs[side].append(_run_in(where, args))
            wall = runs[side][-1]["wall"]["step total"]
            print(f"round {k + 1}/{args.runs} {side:>8s}: step {wall:.2f} s", flush=True)
    return runs


def print_comparison(
    args: argparse.Namespace, rev: str, runs: dict[str, list[dict[str, Any]]]
) -> None:
    this, base = runs["this"], runs[rev]
    print(
        f"\nrecords {args.batch}, rollouts {args.rollouts}θ+{args.rollouts}ρ, threads "
        f"{args.threads}, {args.runs} alternating rounds; decisions this "
        f"{[r['decisions'] for r in this]} vs {rev} {[r['decisions'] for r in base]}"
    )
    print(f"  {'stage':12s} {'this':>9s} {rev:>9s} {'ratio':>7s}   (wall; cpu: this, rev, ratio)")
    for name in this[0]["wall"]:

        def med(rs: list[dict[str, Any]], kind: str, name: str = name) -> float:
            return statistics.median(r[kind][name] for r in rs)

        def ratio(kind: str, name: str = name) -> float:
            pairs = [
                a[kind][name] / b[kind][name]
                for a, b in zip(this, base, strict=True)
                if b[kind][name] > 0
            ]
            return statistics.median(pairs) if pairs else float("nan")

        print(
            f"  {name:12s} {med(this, 'wall'):8.2f}s {med(base, 'wall'):8.2f}s "
            f"{ratio('wall'):7.3f}   {med(this, 'cpu'):8.2f}s {med(base, 'cpu'):8.2f}s "
            f"{ratio('cpu'):7.3f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", default=None)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rollouts", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--step", type=int, default=1)
    p.add_argument(
        "--after",
        type=int,
        default=0,
        metavar="K",
        help="train K steps first (untimed), then time step K+1: a later step's shape, with "
        "the skills' candidates and their paired arms (the setup line includes the K steps)",
    )
    p.add_argument("--rounds", action="store_true", help="split the rollout into its rounds")
    p.add_argument(
        "--vs", metavar="REV", help="also time git revision (or checkout folder) REV, alternating"
    )
    p.add_argument("--runs", type=int, default=3, help="alternating rounds with --vs")
    p.add_argument("--json", action="store_true", help="print one JSON line (used by --vs)")
    args = p.parse_args()
    if args.after < 0:
        p.error(f"--after must be >= 0, got {args.after}")
    if args.after and args.step != 1:
        p.error("--after K times step K+1; it does not combine with --step")
    if args.vs and args.rounds:
        p.error("--rounds splits the rollout of one run; it does not combine with --vs")
    if args.vs:
        side_by_side(args)
        return
    result = measure(args)
    if args.json:
        print(json.dumps(result))
    else:
        print_one(args, result)


if __name__ == "__main__":
    main()
