"""pandera schemas of the tables that cross task boundaries: trajectories and decisions."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pandera.pandas as pa

from evosteer_core.episode.records import FAMILIES

ARMS: tuple[str, ...] = ("theta", "rho", "pair_treat", "pair_control")
"""Natural rollouts under π_θ and ρ, and the two arms of a paired skill trial."""

FEATURE_DIM = 30


def _is_str_list(x: object) -> bool:
    return isinstance(x, list) and len(x) > 0 and all(isinstance(s, str) for s in x)


def log_prob(upper: float) -> list[pa.Check]:
    """A log-probability column: finite (an infinite or NaN log-prob would make the update's
    loss non-finite) and at most ``upper`` (0 plus rounding)."""
    return [pa.Check(np.isfinite, error="finite log-prob"), pa.Check.le(upper)]


def _is_feature_vector(x: object) -> bool:
    return isinstance(x, list) and len(x) == FEATURE_DIM and all(0.0 <= float(v) <= 1.0 for v in x)


def trajectory_head(arms: tuple[str, ...]) -> dict[str, pa.Column]:
    """The columns that name a trajectory of any method: id, step, record, family, arm (one
    of ``arms``), rollout index."""
    return {
        "traj_id": pa.Column(str, unique=True),
        "step": pa.Column(int, pa.Check.ge(0)),
        "record_id": pa.Column(str),
        "family": pa.Column(str, pa.Check.isin(FAMILIES)),
        "arm": pa.Column(str, pa.Check.isin(arms)),
        "rollout_index": pa.Column(int, pa.Check.ge(0)),
    }


TRAJECTORIES = pa.DataFrameSchema(
    {
        **trajectory_head(ARMS),
        "pair_skill": pa.Column(str),
        "pair_kind": pa.Column(str, pa.Check.isin(["", "candidate", "reevaluation"])),
        "n_actions": pa.Column(int, pa.Check.ge(1)),
        "reward": pa.Column(float, pa.Check.in_range(0.0, 1.0)),
        "healthy": pa.Column(bool),
        "complete": pa.Column(bool),
        "tokens": pa.Column(int, pa.Check.ge(0)),
        "model_calls": pa.Column(int, pa.Check.ge(0)),
        "decision_timeouts": pa.Column(int, pa.Check.ge(0)),
        "terminal_features": pa.Column(
            object, pa.Check(lambda s: s.map(_is_feature_vector), error="30 features in [0,1]")
        ),
        "terminal_exact_key": pa.Column(str),
        "terminal_coarse_key": pa.Column(str),
    },
    strict=True,
    coerce=False,
    name="trajectories",
)

DECISION_COLUMNS = {
    "traj_id": pa.Column(str),
    "t": pa.Column(int, pa.Check.ge(0)),
    "prompt": pa.Column(str, pa.Check.str_length(min_value=1)),
    "legal": pa.Column(object, pa.Check(lambda s: s.map(_is_str_list), error="non-empty list")),
    "chosen": pa.Column(int, pa.Check.ge(0)),
    "action": pa.Column(str),
}
"""The columns of a decision of any method: its prompt, the legal strings and the choice."""

CHOICE_CHECKS = [
    pa.Check(
        lambda df: df.apply(lambda r: r["chosen"] < len(r["legal"]), axis=1),
        error="chosen index within the legal set",
    ),
    pa.Check(
        lambda df: df.apply(lambda r: r["legal"][r["chosen"]] == r["action"], axis=1),
        error="action equals legal[chosen]",
    ),
]
"""The choice is one of the decision's legal strings."""

DECISIONS = pa.DataFrameSchema(
    {
        **DECISION_COLUMNS,
        "forced": pa.Column(bool),
        "features": pa.Column(
            object, pa.Check(lambda s: s.map(_is_feature_vector), error="30 features in [0,1]")
        ),
        "value": pa.Column(float, pa.Check.in_range(0.0, 1.0)),
        "exact_key": pa.Column(str),
        "coarse_key": pa.Column(str),
        "logp_sample": pa.Column(float, log_prob(1e-6)),
        "sampled_by": pa.Column(str, pa.Check.isin(["theta", "rho", ""])),
        "h_rho": pa.Column(
            object, pa.Check(lambda s: s.map(lambda x: hasattr(x, "__len__")), error="h_ρ vector or empty")
        ),
    },
    checks=[
        *CHOICE_CHECKS,
        pa.Check(
            lambda df: (df["sampled_by"] == "") == df["forced"],
            error="a decision is forced exactly when no policy sampled it",
        ),
        pa.Check(
            lambda df: (df["h_rho"].map(len) > 0) == (df["sampled_by"] == "rho"),
            error="h_ρ recorded exactly for the decisions ρ sampled",
        ),
    ],
    strict=True,
    coerce=False,
    name="decisions",
)


def validate_tables(trajectories: pd.DataFrame, decisions: pd.DataFrame) -> None:
    """Validate both tables (lazy: the pandera report lists every failing row and check)."""
    TRAJECTORIES.validate(trajectories, lazy=True)
    DECISIONS.validate(decisions, lazy=True)
    missing = set(decisions["traj_id"]) - set(trajectories["traj_id"])
    if missing:
        raise ValueError(f"decisions reference unknown trajectories: {sorted(missing)[:5]}")


def _is_float_list(x: object) -> bool:
    return hasattr(x, "__len__") and len(x) > 0


RESCORED = pa.DataFrameSchema(
    {
        "traj_id": pa.Column(str),
        "t": pa.Column(int, pa.Check.ge(0)),
        "logp_theta": pa.Column(float, log_prob(1e-5)),
        "logp_rho": pa.Column(float, log_prob(1e-5)),
        "h_rho": pa.Column(object, pa.Check(lambda s: s.map(_is_float_list), error="h_ρ vector")),
    },
    strict=True,
    coerce=False,
    name="rescored",
)


def validate_rescored(decisions: pd.DataFrame, rescored: pd.DataFrame) -> None:
    """Validate the re-scoring table and its row alignment with the decisions it scores."""
    RESCORED.validate(rescored, lazy=True)
    same = len(rescored) == len(decisions) and (
        (rescored["traj_id"].to_numpy() == decisions["traj_id"].to_numpy()).all()
        and (rescored["t"].to_numpy() == decisions["t"].to_numpy()).all()
    )
    if not same:
        raise ValueError(
            f"rescored table ({len(rescored)} rows) is not aligned row by row with the "
            f"decisions table ({len(decisions)} rows)"
        )
