"""What each stage of a run really used: its wall-clock seconds, its pod kind and, for the
rollout, the tokens its episodes used (docs/costs.md).

One record per (run, step, stage, shard), written by the stage that measured it as a store
entry ``usage/<run_id>/<step:06d>/<stage>.json`` (``rollout-<shard>`` for a shard of the
fan-out). Records are measurements, not artifacts: they change from execution to execution,
so they stay out of the content-addressed objects, the run index and every hash. A cached
stage writes nothing (the record of the execution that computed it stays); a stage that runs
again (a retry, a replaced cache) replaces its record. The cost model
(:mod:`evosteer_core.pipeline.costs`) prices them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from evosteer_core.episode.budget import TokenUsage
from evosteer_core.infra.artifacts import ArtifactStore, canonical_json

PREFIX = "usage"


@dataclass(frozen=True)
class StageUsage:
    """One stage execution: which stage (and rollout shard), its pod kind (``gpu`` or
    ``cpu``), its seconds (loading inputs, running, storing outputs) and its tokens."""

    stage: str
    device: str
    seconds: float
    tokens: TokenUsage = field(default_factory=TokenUsage)
    shard: int = 0

    def to_dict(self) -> dict:
        return {
            "stage": self.stage,
            "device": self.device,
            "seconds": self.seconds,
            "tokens": self.tokens.to_dict(),
            "shard": self.shard,
        }

    @classmethod
    def from_dict(cls, data: dict) -> StageUsage:
        return cls(
            stage=data["stage"],
            device=data["device"],
            seconds=float(data["seconds"]),
            tokens=TokenUsage(**data["tokens"]),
            shard=int(data.get("shard", 0)),
        )


@dataclass(frozen=True)
class UsageLog:
    """The usage records of one run in its store."""

    store: ArtifactStore
    run_id: str

    def _key(self, step: int, stage: str, shard: int) -> str:
        name = stage if shard == 0 else f"{stage}-{shard}"
        return f"{PREFIX}/{self.run_id}/{step:06d}/{name}.json"

    def record(self, step: int, usage: StageUsage) -> None:
        """Write (or replace) the record of one stage execution of ``step``."""
        key = self._key(step, usage.stage, usage.shard)
        self.store.write_entry(key, canonical_json(usage.to_dict()))

    def steps(self) -> dict[int, list[StageUsage]]:
        """Every recorded step's stage records, by step (ascending)."""
        return self._read(self.store.list_entries(f"{PREFIX}/{self.run_id}"))

    def step(self, step: int) -> list[StageUsage]:
        """The stage records of one step (empty: none recorded), listing only that step."""
        keys = self.store.list_entries(f"{PREFIX}/{self.run_id}/{step:06d}")
        return self._read(keys).get(step, [])

    def _read(self, keys: list[str]) -> dict[int, list[StageUsage]]:
        out: dict[int, list[StageUsage]] = {}
        for key in sorted(keys):
            step = int(key.split("/")[2])
            record = StageUsage.from_dict(json.loads(self.store.read_entry(key)))
            out.setdefault(step, []).append(record)
        return dict(sorted(out.items()))
