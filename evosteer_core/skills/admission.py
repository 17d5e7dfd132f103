"""Skill admission inside the training loop: menus, pair plans, and the validation round.

``SkillState`` is the part of the run state that belongs to validated skill admission
(docs/method.md §1.8): the library, the test ledger, the warm-up evidence pool and the paired
observation counts. The training step asks it for the batch's menus and pairs, and hands it
the batch's trajectories after the update.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from evosteer_core.episode.records import FAMILIES, TaskRecord
from evosteer_core.executors.base import Executor, SkillView
from evosteer_core.skills.author import Author, LLMAuthor, SeededSimAuthor, TrajectorySummary
from evosteer_core.skills.library import SkillLibrary
from evosteer_core.skills.pairs import PairOutcome, PairPlan, plan_pairs
from evosteer_core.skills.sequential import TestLedger
from evosteer_core.skills.validation import RoundConfig, admit_by_count, validation_round

WARMUP_EVIDENCE_PER_FAMILY = 12


@dataclass
class SkillState:
    """Library, ledger and the warm-up evidence pool."""

    enabled: bool
    warmup_steps: int
    reeval_every: int
    author_kind: str
    library: SkillLibrary = field(default_factory=SkillLibrary)
    ledger: TestLedger = field(default_factory=TestLedger)
    warmup_pool: list[dict[str, Any]] = field(default_factory=list)
    admit_after: int | None = None
    """Fixed-count admission after this many successes instead of the sequential tests
    (ablation ``no_sequential_validation``); None: the sequential tests."""
    successes: dict[str, int] = field(default_factory=dict)
    """Per skill: successful skill arms so far (fixed-count admission only)."""

    @classmethod
    def initial(cls, cfg: Any, admit_after: int | None = None) -> SkillState:
        """Empty state from a ``SkillsConfig`` (enabled, warmup_steps, reeval_every, alpha,
        author) and the fixed-count admission's k (None: sequential tests)."""
        return cls(
            enabled=cfg.enabled,
            warmup_steps=cfg.warmup_steps,
            reeval_every=cfg.reeval_every,
            author_kind=cfg.author,
            ledger=TestLedger(alpha=cfg.alpha),
            admit_after=admit_after,
        )

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], cfg: Any, admit_after: int | None = None
    ) -> SkillState:
        if not data:
            return cls.initial(cfg, admit_after)
        return cls(
            enabled=data["enabled"],
            warmup_steps=data["warmup_steps"],
            reeval_every=data["reeval_every"],
            author_kind=data["author_kind"],
            library=SkillLibrary.from_dict(data["library"]),
            ledger=TestLedger.from_dict(data["ledger"]),
            warmup_pool=list(data["warmup_pool"]),
            admit_after=data.get("admit_after"),
            successes=dict(data.get("successes", {})),
        )

    def to_dict(self) -> dict[str, Any]:
        """The state as JSON-able data; the fixed-count fields only when that admission is
        on, so the states of sequentially tested runs keep their bytes."""
        out = {
            "enabled": self.enabled,
            "warmup_steps": self.warmup_steps,
            "reeval_every": self.reeval_every,
            "author_kind": self.author_kind,
            "library": self.library.to_dict(),
            "ledger": self.ledger.to_dict(),
            "warmup_pool": list(self.warmup_pool),
        }
        if self.admit_after is not None:
            out["admit_after"] = self.admit_after
            out["successes"] = dict(sorted(self.successes.items()))
        return out

    # --- what the rollout needs -----------------------------------------------------------
    def menus(self) -> dict[str, tuple[SkillView, ...]]:
        """Per-family menus (validated skills plus the candidate under test)."""
        return {f: self.library.menu(f) for f in FAMILIES} if self.enabled else {}

    def deployed_menus(self) -> dict[str, tuple[SkillView, ...]]:
        """Per-family test-time menus (validated skills only)."""
        return {f: self.library.deployed_menu(f) for f in FAMILIES} if self.enabled else {}

    def pair_plans(self, batch: Sequence[TaskRecord], step: int) -> tuple[PairPlan, ...]:
        if not self.enabled:
            return ()
        items = [(r.record_id, r.family) for r in batch]
        seen = {e.skill_id: self.ledger.observations(e.skill_id) for e in self.library.entries}
        reeval = None if self.admit_after is not None else self.reeval_every
        return plan_pairs(items, self.library, seen, step, reeval)

    # --- the validation round ---------------------------------------------------------------
    def author(self, executor: Executor, run_seed: int) -> Author:
        if self.author_kind == "sim":
            return SeededSimAuthor(run_seed=run_seed)
        return LLMAuthor(executor, run_seed=run_seed)

    def validation_round(
        self,
        trajectories: pd.DataFrame,
        decisions: pd.DataFrame,
        prompts: dict[str, str],
        step: int,
        executor: Executor,
        run_seed: int,
    ) -> dict[str, float]:
        """Pairs → sequential tests → author window; updates the state, returns metrics."""
        if not self.enabled:
            return {}
        outcomes = pair_outcomes(trajectories)
        evidence = self._evidence(trajectories, decisions, prompts, step)
        tested = outcomes
        if self.admit_after is not None:  # counts replace the tests; the round runs windows
            self.library, self.successes, _ = admit_by_count(
                self.library, self.successes, outcomes, step, self.admit_after
            )
            tested = []
        self.library, self.ledger, report = validation_round(
            self.library,
            self.ledger,
            tested,
            step,
            author=self.author(executor, run_seed),
            evidence_pool=evidence,
            config=RoundConfig(warmup_steps=self.warmup_steps),
        )
        statuses = [e.status for e in self.library.entries]
        return {
            "skills_candidate": float(statuses.count("candidate")),
            "skills_validated": float(statuses.count("validated")),
            "skills_retired": float(statuses.count("retired")),
            "alpha_spent": float(report.alpha_spent),
            "pairs": float(len(outcomes)),
        }

    def _evidence(
        self,
        trajectories: pd.DataFrame,
        decisions: pd.DataFrame,
        prompts: dict[str, str],
        step: int,
    ) -> list[TrajectorySummary]:
        """Natural rollouts as evidence; during warm-up they fill the pool (≤ 12 per family)
        that the first window (step warmup+1) sees; later windows see the current batch."""
        natural = trajectories[trajectories["arm"].isin(["theta", "rho"])]
        actions = decisions.groupby("traj_id", sort=False)["action"].apply(list)
        rows = [
            {
                "record_id": r.record_id,
                "family": r.family,
                "prompt": prompts[r.record_id],
                "reward": float(r.reward),
                "healthy": bool(r.healthy),
                "side_effect_free": bool(r.healthy),
                "summary": " ".join(actions.get(r.traj_id, [])),
            }
            for r in natural.itertuples()
        ]
        if step <= self.warmup_steps:
            for row in rows:
                n = sum(1 for p in self.warmup_pool if p["family"] == row["family"])
                if n < WARMUP_EVIDENCE_PER_FAMILY:
                    self.warmup_pool.append(row)
            return []
        pool = self.warmup_pool if step == self.warmup_steps + 1 else rows
        return [TrajectorySummary(**p) for p in pool]


def pair_outcomes(trajectories: pd.DataFrame) -> list[PairOutcome]:
    """One outcome per (record, pair index): treatment vs control rewards and their health."""
    pairs = trajectories[trajectories["arm"].isin(["pair_treat", "pair_control"])]
    out = []
    for (_, _), g in pairs.groupby(["record_id", "rollout_index"], sort=True):
        arms = g.set_index("arm")
        treat, control = arms.loc["pair_treat"], arms.loc["pair_control"]
        out.append(
            PairOutcome(
                record_id=str(treat["record_id"]),
                family=str(treat["family"]),
                skill_id=str(treat["pair_skill"]),
                kind=str(treat["pair_kind"]),
                reward_plus=float(treat["reward"]) if treat["complete"] else None,
                reward_minus=float(control["reward"]) if control["complete"] else None,
                complete=bool(treat["complete"] and control["complete"]),
                side_effect_free=bool(treat["healthy"] and control["healthy"]),
            )
        )
    return out
