"""Structural buckets: ratio-first pooling of R_β(x)/e^u over canonical graph structures (Eq. 9, B.10).

Each eligible visit of trajectory x to a structure adds y_x = R_β(x)/e^{u_{q,x}} − 1 to that
structure's exact bucket and to its coarse bucket (visit multiplicity kept: a state visited
twice counts twice). A bucket with n visits and sum Σy gives

    A = 1 + Σy / (n + n0),    c = clip_[−c_max, c_max](log A).

A lookup uses the exact bucket if it has at least ``min_visits`` visits, else the coarse bucket
if that one has, else c = 0. Reads are one step behind: lookups see only the *committed* view;
this step's visits accumulate in a *pending* view that :meth:`StructuralBuckets.commit` folds in
at the end of the step. Keys are opaque strings computed by the caller (the graph module).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from evosteer_core.anchors.config import AnchorConfig

STATE_VERSION = 1
"""Version of the serialized buckets; bump when the layout of ``to_dict`` changes."""

_MIN_RATIO = 1e-12
"""Positive-domain safeguard for log A when round-off pushes Σy/(n + n0) to −1."""


@dataclass(frozen=True)
class StateKeys:
    """The bucket keys of one state: its canonical structure (exact) and (n, |E|, stopped)."""

    exact: str
    coarse: str

    def __post_init__(self) -> None:
        for name in ("exact", "coarse"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"StateKeys.{name}: expected str, got {getattr(self, name)!r}")


@dataclass
class _Bucket:
    """Visit count n and Σ y of one bucket."""

    sum_y: float = 0.0
    n: int = 0


_Level = dict[str, _Bucket]


def visit_ratio_excess(log_reward: float, u: float) -> float:
    """y_x = R_β(x) / e^{u_{q,x}} − 1, computed as expm1(log R_β − u)."""
    if not (math.isfinite(log_reward) and math.isfinite(u)):
        raise ValueError(f"visit ratio: log_reward={log_reward}, u={u} must be finite")
    return math.expm1(log_reward - u)


class StructuralBuckets:
    """Committed and pending visit statistics per exact and coarse structure key."""

    def __init__(self, config: AnchorConfig | None = None) -> None:
        self.config = config or AnchorConfig()
        self._committed: dict[str, _Level] = {"exact": {}, "coarse": {}}
        self._pending: dict[str, _Level] = {"exact": {}, "coarse": {}}

    def add_trajectory(self, states: Iterable[StateKeys], log_reward: float, u: float) -> None:
        """Add one visit per listed state (decision states and the terminal) to the pending view.

        ``log_reward`` is log R_β(x), ``u`` the trajectory's measured anchor u_{q,x}.
        """
        y = visit_ratio_excess(log_reward, u)
        for keys in states:
            for level, key in (("exact", keys.exact), ("coarse", keys.coarse)):
                bucket = self._pending[level].setdefault(key, _Bucket())
                bucket.sum_y += y
                bucket.n += 1

    def commit(self) -> None:
        """End of step: fold the pending visits into the committed view read by later steps."""
        for level, pending in self._pending.items():
            committed = self._committed[level]
            for key in sorted(pending):
                bucket = committed.setdefault(key, _Bucket())
                bucket.sum_y += pending[key].sum_y
                bucket.n += pending[key].n
            pending.clear()

    def visits(self, keys: StateKeys) -> tuple[int, int]:
        """Committed visit counts (exact, coarse) of a state's buckets."""
        return (
            self._committed["exact"].get(keys.exact, _Bucket()).n,
            self._committed["coarse"].get(keys.coarse, _Bucket()).n,
        )

    def correction(self, keys: StateKeys) -> float:
        """c(g(s)) from the committed view: exact bucket, else coarse, else 0."""
        for level, key in (("exact", keys.exact), ("coarse", keys.coarse)):
            bucket = self._committed[level].get(key)
            if bucket is not None and bucket.n >= self.config.min_visits:
                return self._clipped_log_ratio(bucket)
        return 0.0

    def corrections(self, states: Iterable[StateKeys]) -> list[float]:
        """:meth:`correction` for each state of a trajectory."""
        return [self.correction(keys) for keys in states]

    def _clipped_log_ratio(self, bucket: _Bucket) -> float:
        cfg = self.config
        ratio = 1.0 + bucket.sum_y / (bucket.n + cfg.n0)
        c = math.log(max(ratio, _MIN_RATIO))
        return min(cfg.c_max, max(-cfg.c_max, c))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state with sorted keys, pending visits included."""

        def dump(levels: dict[str, _Level]) -> dict[str, Any]:
            return {
                level: {
                    k: [levels[level][k].sum_y, levels[level][k].n] for k in sorted(levels[level])
                }
                for level in sorted(levels)
            }

        return {
            "version": STATE_VERSION,
            "config": self.config.to_dict(),
            "committed": dump(self._committed),
            "pending": dump(self._pending),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StructuralBuckets:
        """Inverse of :meth:`to_dict`; rejects other versions."""
        if data.get("version") != STATE_VERSION:
            raise ValueError(
                f"StructuralBuckets state: version {data.get('version')!r}, expected {STATE_VERSION}"
            )
        buckets = cls(AnchorConfig.from_dict(data["config"]))
        for view, target in (("committed", buckets._committed), ("pending", buckets._pending)):
            for level in ("exact", "coarse"):
                target[level] = {
                    k: _Bucket(float(s), int(n)) for k, (s, n) in data[view][level].items()
                }
        return buckets
