"""What a finished run shows a newcomer: π_θ against ρ, and against the best fixed paradigm,
on the held-out tasks, each as a paired difference with its standard error.

Every row is evaluated on the same held-out records under the same seeds (``evaluation.rows``),
so the comparison is paired per record: the standard error is the sample sd of the
per-record differences (each record's mean over runs) over √n. The best paradigm is picked on
these same records, which favours it: θ is compared with the strongest fixed competitor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from evosteer_core.episode.world import load_records
from evosteer_core.evaluation.rows import row_rollouts
from evosteer_core.infra.config import RunConfig
from evosteer_core.training.session import open_session
from evosteer_core.training.state import TrainState

PARADIGM_ROWS = ("paradigm:react", "paradigm:template", "paradigm:plan_execute")
"""The fixed paradigms a run is compared with (those that need no offline search)."""

TAG = "heldout-summary"


@dataclass(frozen=True)
class Paired:
    """Mean of a − b over records and its standard error."""

    diff: float
    se: float

    def text(self) -> str:
        se = "n/a" if math.isnan(self.se) else f"{self.se:.3f}"
        return f"{self.diff:+.3f} ± {se}"


def paired(a: pd.DataFrame, b: pd.DataFrame) -> Paired:
    """The paired difference of two row tables on the same records and runs."""
    per_a = a.groupby("record_id")["reward"].mean()
    per_b = b.groupby("record_id")["reward"].mean()
    if sorted(per_a.index) != sorted(per_b.index):
        raise ValueError("the two rows were not evaluated on the same records")
    d = (per_a - per_b.loc[per_a.index]).to_numpy()
    n = len(d)
    se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return Paired(float(d.mean()), se)


@dataclass(frozen=True)
class HeldoutSummary:
    tasks: int
    runs: int
    theta: float
    rho: float
    versus_rho: Paired
    paradigm: str
    paradigm_mean: float
    versus_paradigm: Paired

    def lines(self, simulated: bool) -> list[str]:
        sim = ", SIMULATED" if simulated else ""
        return [
            f"Held-out ({self.tasks} tasks × {self.runs} run{'s' * (self.runs > 1)}{sim}):",
            f"  π_θ {self.theta:.3f}   ρ {self.rho:.3f}   θ − ρ {self.versus_rho.text()} (paired SE)",
            f"  best fixed paradigm {self.paradigm} {self.paradigm_mean:.3f}   "
            f"θ − it {self.versus_paradigm.text()}",
        ]


def heldout_summary(cfg: RunConfig, state: TrainState, runs: int = 1) -> HeldoutSummary:
    """θ, ρ and the fixed paradigms on every held-out record, ``runs`` runs each."""
    session = open_session(cfg, state)
    records = load_records(cfg)[1]
    rows = ("checkpoint", "untrained", *PARADIGM_ROWS)
    tables = {row: row_rollouts(session, row, records, runs, TAG) for row in rows}
    means = {row: float(t["reward"].mean()) for row, t in tables.items()}
    best = max(PARADIGM_ROWS, key=lambda r: (means[r], r))
    theta = tables["checkpoint"]
    return HeldoutSummary(
        tasks=len(records),
        runs=runs,
        theta=means["checkpoint"],
        rho=means["untrained"],
        versus_rho=paired(theta, tables["untrained"]),
        paradigm=best.removeprefix("paradigm:"),
        paradigm_mean=means[best],
        versus_paradigm=paired(theta, tables[best]),
    )
