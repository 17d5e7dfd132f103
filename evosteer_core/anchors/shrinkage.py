"""Hierarchical shrinkage of reference success rates: global → family → record (B.3–B.4).

The pool holds the rewards of healthy, non-paired natural reference rollouts and grows over
the whole run. The anchor of a scored trajectory x on record q is

    m_g = S_g / N_g (1/2 if N_g = 0)
    m_c = (S_c + κ_g m_g) / (N_c + κ_g)
    m_0 = (n'_d p_d + κ_c m_c) / (n'_d + κ_c),  n'_d = min(n_d, prior_cap)  (m_0 = m_c without prior)
    p̂  = clip_[0,1]((S_q^(−x) + κ_q m_0) / (N_q^(−x) + κ_q))
    u  = log(1 + a_β p̂)

where the superscript (−x) removes x's own reward from the record's sums when x is in the pool
(leave-one-out at the task level only; the family and global sums keep it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from evosteer_core.anchors.config import AnchorConfig, check_reward
from evosteer_core.episode.records import FAMILIES

STATE_VERSION = 1
"""Version of the serialized pool; bump when the layout of ``to_dict`` changes."""

_TOLERANCE = 1e-9
"""Slack for float round-off when a leave-one-out subtraction is checked against the sums."""


@dataclass(frozen=True)
class RecordPrior:
    """Optional prior success rate p_d of a record, worth n_d pseudo-observations."""

    p: float
    n: float

    def __post_init__(self) -> None:
        check_reward(self.p, "RecordPrior.p")
        if not (math.isfinite(self.n) and self.n >= 0):
            raise ValueError(f"RecordPrior.n: expected finite >= 0, got {self.n}")


@dataclass(frozen=True)
class Anchor:
    """Every level of one anchor: means m_g, m_c, m_0, the estimate p̂ and u = log(1 + a_β p̂)."""

    m_g: float
    m_c: float
    m_0: float
    p_hat: float
    u: float


@dataclass
class _Sums:
    """Reward sum S and trajectory count N at one level of the pool."""

    s: float = 0.0
    n: int = 0

    def to_list(self) -> list[float | int]:
        return [self.s, self.n]


class ShrinkagePool:
    """Cumulative reward sums at the global, family and record levels, and the anchors they give."""

    def __init__(self, config: AnchorConfig | None = None) -> None:
        self.config = config or AnchorConfig()
        self._global = _Sums()
        self._family: dict[str, _Sums] = {}
        self._record: dict[str, _Sums] = {}
        self._record_family: dict[str, str] = {}

    def add(self, record_id: str, family: str, reward: float) -> None:
        """Add one healthy, non-paired natural reference rollout of ``record_id`` to the pool."""
        check_reward(reward, f"reward of record {record_id!r}")
        self._check_family(record_id, family)
        self._record_family[record_id] = family
        for sums in (
            self._global,
            self._family.setdefault(family, _Sums()),
            self._record.setdefault(record_id, _Sums()),
        ):
            sums.s += float(reward)
            sums.n += 1

    def counts(self, record_id: str, family: str) -> tuple[int, int, int]:
        """(N_g, N_c, N_q): pooled rollouts globally, in ``family`` and on ``record_id``."""
        return (
            self._global.n,
            self._family.get(family, _Sums()).n,
            self._record.get(record_id, _Sums()).n,
        )

    def anchor(
        self,
        record_id: str,
        family: str,
        *,
        leave_out: float | None = None,
        prior: RecordPrior | None = None,
    ) -> Anchor:
        """The anchor of a trajectory on ``record_id``.

        ``leave_out`` is the scored trajectory's own reward when that trajectory is in the pool
        (it is then removed once from the record's sums); ``None`` when it is not (a θ rollout,
        a paired arm, an unhealthy one).
        """
        self._check_family(record_id, family)
        cfg = self.config
        m_g = self._global.s / self._global.n if self._global.n else 0.5
        fam = self._family.get(family, _Sums())
        m_c = (fam.s + cfg.kappa_g * m_g) / (fam.n + cfg.kappa_g)
        if prior is None:
            m_0 = m_c
        else:
            n_d = min(prior.n, cfg.prior_cap)
            m_0 = (n_d * prior.p + cfg.kappa_c * m_c) / (n_d + cfg.kappa_c)
        rec = self._record.get(record_id, _Sums())
        s_q, n_q = rec.s, rec.n
        if leave_out is not None:
            check_reward(leave_out, f"leave_out reward of record {record_id!r}")
            if (
                n_q < 1
                or leave_out > s_q + _TOLERANCE
                or (s_q - leave_out) > (n_q - 1) + _TOLERANCE
            ):
                raise ValueError(
                    f"leave_out={leave_out} for record {record_id!r}: not a pooled reward "
                    f"(record sums S_q={s_q}, N_q={n_q})"
                )
            s_q, n_q = s_q - leave_out, n_q - 1
        p_hat = min(1.0, max(0.0, (s_q + cfg.kappa_q * m_0) / (n_q + cfg.kappa_q)))
        return Anchor(m_g=m_g, m_c=m_c, m_0=m_0, p_hat=p_hat, u=cfg.measured_flow(p_hat))

    def _check_family(self, record_id: str, family: str) -> None:
        if family not in FAMILIES:
            raise ValueError(f"record {record_id!r}: family {family!r} not in {FAMILIES}")
        known = self._record_family.get(record_id)
        if known is not None and known != family:
            raise ValueError(
                f"record {record_id!r}: family {family!r} differs from its pooled family {known!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state with sorted keys: config, sums per level, record → family."""
        return {
            "version": STATE_VERSION,
            "config": self.config.to_dict(),
            "global": self._global.to_list(),
            "family": {k: self._family[k].to_list() for k in sorted(self._family)},
            "record": {k: self._record[k].to_list() for k in sorted(self._record)},
            "record_family": {k: self._record_family[k] for k in sorted(self._record_family)},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShrinkagePool:
        """Inverse of :meth:`to_dict`; rejects other versions."""
        if data.get("version") != STATE_VERSION:
            raise ValueError(
                f"ShrinkagePool state: version {data.get('version')!r}, expected {STATE_VERSION}"
            )
        pool = cls(AnchorConfig.from_dict(data["config"]))
        pool._global = _Sums(float(data["global"][0]), int(data["global"][1]))
        pool._family = {k: _Sums(float(s), int(n)) for k, (s, n) in data["family"].items()}
        pool._record = {k: _Sums(float(s), int(n)) for k, (s, n) in data["record"].items()}
        pool._record_family = dict(data["record_family"])
        return pool
