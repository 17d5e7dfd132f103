"""Anchor configuration and the reward transforms that depend on β (Eq. 2, Eq. 8)."""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class AnchorConfig:
    """Strengths of the reference statistics (docs/method.md §1.7, Table 3).

    beta: reward temperature β; R_β(x) = 1 + (e^β − 1) r(x).
    kappa_g, kappa_c, kappa_q: shrinkage strengths toward the global, family and record levels.
    prior_cap: cap on the record prior's pseudo-count (n'_d = min(n_d, prior_cap)).
    n0: pseudo-visits of a structural bucket; c_max: clip of the structural correction.
    min_visits: visits a bucket needs before its correction is read.
    """

    beta: float = 2.0
    kappa_g: float = 2.0
    kappa_c: float = 4.0
    kappa_q: float = 0.5
    prior_cap: float = 20.0
    n0: float = 8.0
    c_max: float = 0.25
    min_visits: int = 8

    def __post_init__(self) -> None:
        if not (math.isfinite(self.beta) and self.beta >= 0):
            raise ValueError(f"AnchorConfig.beta: expected finite >= 0, got {self.beta}")
        for name in ("kappa_g", "kappa_c", "kappa_q"):
            if not getattr(self, name) > 0:
                raise ValueError(f"AnchorConfig.{name}: expected > 0, got {getattr(self, name)}")
        for name in ("prior_cap", "c_max"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"AnchorConfig.{name}: expected >= 0, got {getattr(self, name)}")
        if not self.n0 > 0:
            # n0 = 0 leaves c(g) undefined on an empty bucket (Lemma B.6).
            raise ValueError(f"AnchorConfig.n0: expected > 0, got {self.n0}")
        if self.min_visits < 1:
            raise ValueError(f"AnchorConfig.min_visits: expected >= 1, got {self.min_visits}")

    @property
    def a_beta(self) -> float:
        """a_β = e^β − 1."""
        return math.expm1(self.beta)

    def log_reward(self, reward: float) -> float:
        """log R_β(x) = log(1 + a_β r) for a reward r in [0, 1]; lies in [0, β]."""
        check_reward(reward, "reward")
        return math.log1p(self.a_beta * reward)

    def measured_flow(self, p_hat: float) -> float:
        """u = log(1 + a_β p̂) for an anchor p̂ in [0, 1] (Definition B.1)."""
        check_reward(p_hat, "p_hat")
        return math.log1p(self.a_beta * p_hat)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AnchorConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"AnchorConfig: unknown fields {unknown}; expected some of {sorted(known)}"
            )
        return cls(**data)


def check_reward(value: float, what: str) -> None:
    """Raise if ``value`` is not a finite number in [0, 1]."""
    if not (isinstance(value, numbers.Real) and math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"{what}: expected a number in [0, 1], got {value!r}")
