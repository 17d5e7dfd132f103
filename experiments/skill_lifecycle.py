"""Skill lifecycle of a tiny-sim training run with skills on, and the admission gain.

Usage: python experiments/skill_lifecycle.py [--steps 8] [--batch 24] [--rollouts 1] [--seed 42]
           [--warmup 2] [--heldout 8] [--eval-runs 1]
Everything here is SIMULATED (sim executor, seeded sim author). Prints per step the skill
counts and the alpha spent, then the lifecycle table (proposed / validated / retired steps,
W/L/T, Δ̂, and the hidden SIMULATED effect of each skill), then the admission gain (docs/method.md §1.10):
held-out mean reward of the trained θ with menus = validated skills only vs menus = every
proposed skill admitted as if validated (same records and seeds), with menus = none for scale.
The defaults took 19.6 min on the shared 2-core machine (load ~7) and are too short for the
sequential tests to decide; docs/skills_run.md has the output and how long a deciding run is.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: experiments.*

from evosteer_core.episode.records import FAMILIES
from evosteer_core.episode.world import build_world
from evosteer_core.evaluation.rollouts import evaluate_policy
from evosteer_core.infra.config import load_config
from evosteer_core.sim.skills import skill_effect
from evosteer_core.skills.library import SkillLibrary
from evosteer_core.training.loop import train_step
from evosteer_core.training.session import Session, init_state, open_session
from experiments.lifecycle import (
    admit_all,
    format_lifecycle,
    lifecycle_rows,
    validated_only,
)


def with_library(s: Session, library: SkillLibrary) -> Session:
    """The same session whose skill menus come from ``library`` (a new object; ``s`` is kept)."""
    return replace(s, skills=replace(s.skills, library=library))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", default=None, help="run config (default: embedded tiny-sim)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=24, help="batch records (pairs/family/step = B/6)")
    p.add_argument("--rollouts", type=int, default=1, help="θ and ρ rollouts per record each")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--warmup", type=int, default=2, help="skills.warmup_steps")
    p.add_argument("--reeval-every", type=int, default=5, help="skills.reeval_every")
    p.add_argument("--heldout", type=int, default=8, help="held-out records per family")
    p.add_argument("--eval-runs", type=int, default=1, help="rollouts per held-out record")
    args = p.parse_args()
    torch.set_num_threads(1)
    overrides = {
        "train.seed": args.seed,
        "train.batch_size": args.batch,
        "train.rollouts_theta": args.rollouts,
        "train.rollouts_rho": args.rollouts,
        "sim.n_heldout_per_family": args.heldout,
        "skills.enabled": True,
        "skills.author": "sim",
        "skills.warmup_steps": args.warmup,
        "skills.reeval_every": args.reeval_every,
    }
    cfg = load_config(args.config, overrides=overrides)
    world = build_world(cfg)
    state = init_state(cfg)
    print("SIMULATED executor and author. Overrides:", overrides, flush=True)
    print(
        f"{'step':>4} {'cand':>4} {'valid':>5} {'retir':>5} {'pairs':>5} {'alpha spent':>12} "
        f"{'θ reward':>8} {'time':>6}",
        flush=True,
    )
    t0 = time.time()
    for step in range(1, args.steps + 1):
        s = open_session(cfg, state, world)
        state, m = train_step(s, state, step)
        print(
            f"{step:>4} {m['skills_candidate']:>4.0f} {m['skills_validated']:>5.0f} "
            f"{m['skills_retired']:>5.0f} {m['pairs']:>5.0f} {m['alpha_spent']:>12.3e} "
            f"{m['reward_theta']:>8.3f} {time.time() - t0:>5.0f}s",
            flush=True,
        )
    s = open_session(cfg, state, world)
    library, ledger = s.skills.library, s.skills.ledger
    rows = lifecycle_rows(library, ledger)
    print(
        f"\nSkill lifecycle after {args.steps} steps (library v{library.version}, "
        f"{len(ledger.comparisons)} comparisons, {len(ledger.records)} directional tests, "
        f"alpha spent {ledger.alpha_spent():.3e} of {ledger.alpha})."
    )
    print("Steps: prop = proposed, valid = promoted, retir = retired; '-' = never. W/L/T over all")
    print("of the skill's comparisons; Δ̂ = (W−L)/(W+L+T0). SIM effect = the hidden SIMULATED")
    print("logit the sim adds to a bound node's attempts (ground truth, never shown to the run).")
    print(format_lifecycle(rows, skill_effect))
    undecided = [r for r in rows if r.status == "candidate"]
    if undecided:
        print(
            f"{len(undecided)} of {len(rows)} skills are still candidates: the run was too short "
            "for their sequential tests to decide."
        )

    arms = {
        "validated only": validated_only(library),
        "admit every candidate": admit_all(library),
        "no skills": SkillLibrary(),
    }
    n_eval = len(world.heldout_records) * args.eval_runs
    print(
        f"\nAdmission gain (SIMULATED): held-out mean reward of the trained θ, "
        f"{len(world.heldout_records)} records × {args.eval_runs} runs = {n_eval} episodes "
        "per arm, same records and seeds in every arm."
    )
    results: dict[str, float] = {}
    by_menus: dict[str, float] = {}  # identical menus give identical episodes: evaluate once
    for label, lib in arms.items():
        sizes = {f: len(lib.menu(f)) for f in FAMILIES}
        key = repr([lib.menu(f) for f in FAMILIES])
        if key not in by_menus:
            by_menus[key] = evaluate_policy(
                with_library(s, lib), world.heldout_records, True, args.eval_runs, "heldout"
            )
        r = results[label] = by_menus[key]
        se = math.sqrt(max(r * (1 - r), 0.0) / n_eval) if 0 <= r <= 1 else float("nan")
        print(f"  {label:<22} {r:.3f} (±{se:.3f} binomial s.e.)  menu sizes {sizes}", flush=True)
    gain = results["validated only"] - results["admit every candidate"]
    print(f"  admission gain (validated only − admit every candidate): {gain:+.3f}")
    print(f"total time {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
