"""The admission gain of stored runs: each trained checkpoint evaluated as an experiment cell is,
with four skill menus.

Usage: python experiments/admission_gain.py --store STORE --run RUN [--run RUN ...] [--runs 5]
Everything here is SIMULATED when the runs are. For each run, its checkpoint at its last step
(or ``--step``) is evaluated the way ``evosteer experiment`` evaluates a trained cell
(``experiment.cells.cell_trajectories``: every held-out record, ``--runs`` runs, the same
evaluation seeds), once per menu: the validated skills only (what is deployed at test time and
what an experiment's table reports), the training menus (validated skills and each family's
candidate under test: what tables reported before evaluation deployed validated skills only),
every skill ever proposed admitted as if validated, and none. It prints the held-out mean
reward (the mean of the family means, %) of each, and the admission gain (docs/method.md
§1.10: validated only − admit every candidate). docs/table2_sim.md ("The competent prior at a
hundred steps") has the figures of the table2-sim cells.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: experiments.*

from evosteer_core.episode.world import load_records
from evosteer_core.evaluation.rows import row_rollouts
from evosteer_core.experiment.cells import EVALUATION_TAG
from evosteer_core.experiment.table import seed_mean
from evosteer_core.infra.artifacts import MissingArtifactError
from evosteer_core.skills.library import SkillLibrary
from evosteer_core.training.session import Session, open_session
from experiments.lifecycle import admit_all
from experiments.probe_session import stored_checkpoint
from experiments.skill_lifecycle import with_library

ARMS = ("validated only", "with candidates under test", "admit every candidate", "no skills")


def arm_menus(s: Session) -> dict[str, dict]:
    """The per-family menus of each of :data:`ARMS`, from a checkpoint's session ``s``."""
    library = s.skills.library
    return {
        "validated only": s.skills.deployed_menus(),
        "with candidates under test": s.skills.menus(),
        "admit every candidate": with_library(s, admit_all(library)).skills.deployed_menus(),
        "no skills": with_library(s, SkillLibrary()).skills.deployed_menus(),
    }


def heldout_mean(table: pd.DataFrame) -> float:
    """The held-out mean reward (%) of an evaluation table, as the experiment table's
    per-seed figure (the mean of its family means)."""
    return 100 * seed_mean(table)


def admission_gain(store_root: str, run: str, runs: int, step: int | None = None) -> dict:
    """Held-out mean (%) of ``run``'s checkpoint under each arm's menus, with the menu sizes."""
    cfg, state, at = stored_checkpoint(store_root, run, step)
    session = open_session(cfg, state)
    heldout = load_records(cfg)[1]
    out: dict[str, dict] = {}
    by_menus: dict[str, float] = {}  # identical menus give identical episodes: evaluate once
    for label, menus in arm_menus(session).items():
        key = repr(menus)
        if key not in by_menus:
            table = row_rollouts(session, "checkpoint", heldout, runs, EVALUATION_TAG, menus=menus)
            by_menus[key] = heldout_mean(table)
        out[label] = {"mean": by_menus[key], "menu": sum(len(m) for m in menus.values())}
    return {"run": run, "step": at, "seed": cfg.train.seed, "arms": out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--store", required=True, help="the store root the runs live in")
    p.add_argument("--run", action="append", required=True, help="a run id (repeatable)")
    p.add_argument("--runs", type=int, default=5, help="evaluation runs per held-out record")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the last)")
    args = p.parse_args()
    for run in args.run:
        try:
            r = admission_gain(args.store, run, args.runs, args.step)
        except MissingArtifactError as exc:  # a run id or step the store does not hold
            sys.exit(f"admission_gain: {exc}")
        arms = r["arms"]
        cells = "  ".join(f"{k} {v['mean']:.2f} (menu {v['menu']})" for k, v in arms.items())
        gain = arms["validated only"]["mean"] - arms["admit every candidate"]["mean"]
        print(f"{run} step {r['step']} seed {r['seed']}: {cells}; admission gain {gain:+.2f}")


if __name__ == "__main__":
    main()
