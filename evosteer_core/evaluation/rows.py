"""Evaluation rows (docs/paradigms.md): the trained policy, the untrained architecture and the
fixed paradigms, evaluated on the same records under the same seeds.

A row name is ``checkpoint`` (π_θ, adapter on), ``untrained`` (ρ: the same architecture with
the adapter off), ``direct`` (the frozen executor alone) or ``paradigm:<name>``
(``paradigms.registry``). :func:`row_rollouts` runs one row; run k of tag T uses the run seed
``derive_seed(train.seed, "T/k")`` and every record's episode key, whatever the row, so the
rows of one tag share every executor draw a common node makes (common random numbers:
differences between rows are paired per record and run). Paradigm rows run in the standard
runtime (interleaved, with repair) even in a run that ablates either. The ``checkpoint`` row of tag
``eval/<benchmark>`` is exactly what ``benchmark_scores`` has always computed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pandas as pd

from evosteer_core.collabflow.evaluation import TeamEpisode, fixed_teams, team_episode
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.rollout import EpisodePlan, run_rollouts
from evosteer_core.episode.runtime import Episode
from evosteer_core.infra.artifacts import ArtifactRef, ArtifactStore, get_json, put_json
from evosteer_core.infra.seeding import derive_seed
from evosteer_core.paradigms.registry import NAMES, paradigm
from evosteer_core.paradigms.runner import run_paradigm
from evosteer_core.training.session import Session

CHECKPOINT, UNTRAINED, DIRECT = "checkpoint", "untrained", "direct"
PARADIGM_PREFIX = "paradigm:"
ROWS: tuple[str, ...] = (
    CHECKPOINT,
    UNTRAINED,
    DIRECT,
    *(PARADIGM_PREFIX + n for n in NAMES if n != DIRECT),
)
"""Every row name, in table order."""

COLUMNS: tuple[str, ...] = (
    "row",
    "run",
    "record_id",
    "family",
    "reward",
    "healthy",
    "complete",
    "n_actions",
    "model_calls",
    "tokens",
    "tokens_in",
    "tokens_out",
    "orchestrator_tokens_in",
    "orchestrator_tokens_out",
    "executor_tokens_in",
    "executor_tokens_out",
)
"""A row table: one trajectory per (record, run); tokens as the episode's ledger booked them,
split into the orchestrator's decisions and the executor's node executions."""


class RowError(ValueError):
    """An evaluation row name that does not exist (the message lists the known ones)."""


def parse_rows(items: Iterable[str]) -> list[str]:
    """Row names from comma-separated items, in order, each once; unknown names fail."""
    rows: list[str] = []
    for item in items:
        for name in (x.strip() for x in item.split(",")):
            if not name:
                continue
            if name not in ROWS:
                raise RowError(f"unknown evaluation row {name!r}; known: {', '.join(ROWS)}")
            if name not in rows:
                rows.append(name)
    return rows


def row_rollouts(
    s: Session,
    row: str,
    records: Sequence[TaskRecord],
    runs: int,
    tag: str,
    searched: Mapping[str, Any] | None = None,
    menus: dict | None = None,
) -> pd.DataFrame:
    """The row table (:data:`COLUMNS`) of ``row`` on ``records``, ``runs`` runs each.

    ``searched``: the result of ``paradigms.searched.search_workflows`` (for
    ``paradigm:searched`` only). ``menus``: skill menus in place of the deployed ones (the
    validated skills; a diagnostic's other arms). Raises ``ExecutorOutageError`` as a rollout
    does."""
    (row,) = parse_rows([row])
    if s.cfg.method == "collabflow":
        return _team_rollouts(s, row, records, runs, tag, menus)
    fixed = None if row in (CHECKPOINT, UNTRAINED) else _paradigm(row, searched)
    arm = "theta" if row == CHECKPOINT else "rho"
    plans = [EpisodePlan(r, arm, 0, evaluation=True) for r in records]
    out: list[dict[str, Any]] = []
    for k in range(runs):
        ctx = s.rollout_context(
            derive_seed(s.cfg.train.seed, f"{tag}/{k}"), 0, menus, evaluation=True
        )
        if fixed is None:
            episodes = run_rollouts(s.policy, plans, ctx).episodes
        else:  # a paradigm runs in the standard runtime, whatever the run ablates
            episodes = run_paradigm(fixed, plans, replace(ctx, interleaved=True, repair=True))
        out += [_trajectory(row, k, p.record, ep) for p, ep in zip(plans, episodes, strict=True)]
    return pd.DataFrame(out, columns=list(COLUMNS))


def _team_rollouts(
    s: Session, row: str, records: Sequence[TaskRecord], runs: int, tag: str, menus: dict | None
) -> pd.DataFrame:
    """A CollabFlow run's row (docs/collabflow.md §5): ``checkpoint`` constructs with the
    trained director θ, ``untrained`` with ρ (or either runs ``collabflow.fixed_team``); the
    run seeds are the EvoSteer rows' of the same tag."""
    if row not in (CHECKPOINT, UNTRAINED):
        raise RowError(f"a CollabFlow run evaluates {CHECKPOINT} or {UNTRAINED}, not {row!r}")
    fixed = fixed_teams(s)
    out: list[dict[str, Any]] = []
    for k in range(runs):
        ctx = s.rollout_context(
            derive_seed(s.cfg.train.seed, f"{tag}/{k}"), 0, menus, evaluation=True
        )
        for r in records:
            ep = team_episode(s, ctx, r, row == CHECKPOINT, fixed.get(r.family))
            out.append(_team_trajectory(row, k, ep))
    return pd.DataFrame(out, columns=list(COLUMNS))


def _team_trajectory(row: str, run: int, ep: TeamEpisode) -> dict[str, Any]:
    """A team episode as a row table's trajectory: the director's scoring tokens are the
    orchestrator's (input) tokens, the execution ledger's are the executor's."""
    con = ep.construction_tokens
    outcome = ep.outcome
    led = None if outcome is None else outcome.ledger
    t_in = 0 if led is None else led.tokens_in
    t_out = 0 if led is None else led.tokens_out
    return {
        "row": row,
        "run": run,
        "record_id": ep.record.record_id,
        "family": ep.record.family,
        "reward": ep.reward,
        "healthy": outcome is None or "infrastructure" not in (outcome.stopped or ""),
        "complete": outcome is not None,
        "n_actions": 0 if ep.construction is None else len(ep.construction.steps),
        "model_calls": 0 if led is None else led.model_calls,
        "tokens": con + t_in + t_out,
        "tokens_in": con + t_in,
        "tokens_out": t_out,
        "orchestrator_tokens_in": con,
        "orchestrator_tokens_out": 0,
        "executor_tokens_in": t_in,
        "executor_tokens_out": t_out,
    }


def _paradigm(row: str, searched: Mapping[str, Any] | None) -> Any:
    name = DIRECT if row == DIRECT else row.removeprefix(PARADIGM_PREFIX)
    return paradigm(name, searched)


def _trajectory(row: str, run: int, record: TaskRecord, ep: Episode) -> dict[str, Any]:
    led = ep.ledger
    return {
        "row": row,
        "run": run,
        "record_id": record.record_id,
        "family": record.family,
        "reward": float(ep.reward if ep.reward is not None else 0.0),
        "healthy": ep.healthy,
        "complete": ep.stopped,
        "n_actions": len(ep.history),
        "model_calls": led.model_calls,
        "tokens": led.tokens,
        "tokens_in": led.tokens_in,
        "tokens_out": led.tokens_out,
        "orchestrator_tokens_in": led.orchestrator_tokens_in,
        "orchestrator_tokens_out": led.orchestrator_tokens_out,
        "executor_tokens_in": led.tokens_in - led.orchestrator_tokens_in,
        "executor_tokens_out": led.tokens_out - led.orchestrator_tokens_out,
    }


def run_means(table: pd.DataFrame) -> list[float]:
    """Mean reward of each run of a row table, in run order (one score per run)."""
    return [float(table.loc[table["run"] == k, "reward"].mean()) for k in sorted(set(table["run"]))]


def store_row_table(store: ArtifactStore, table: pd.DataFrame) -> ArtifactRef:
    """A row table as canonical JSON records (equal tables, equal refs)."""
    return put_json(store, table.to_dict("records"), "rows.json")


def load_row_table(store: ArtifactStore, ref: ArtifactRef) -> pd.DataFrame:
    return pd.DataFrame(get_json(store, ref), columns=list(COLUMNS))
