"""Replay: recompute one recorded training step and compare it, artifact by artifact.

The step's input (the previous step's state) is read from the run index; the step is recomputed
with the same functions the pipeline ran (:mod:`evosteer_core.pipeline.stage_io`), writing into memory
only. Each output artifact is then *identical* (same sha256 and the stored object intact) or
*differs*, with the first differing field (table column and row, or the key path into a state).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from evosteer_core.infra.artifacts import (
    ArtifactRef,
    ArtifactStore,
    CorruptArtifactError,
    MissingArtifactError,
    RunIndex,
)
from evosteer_core.infra.config import RunConfig
from evosteer_core.pipeline.stage_io import TABLES, StepStore, read_table, run_step, step_artifacts
from evosteer_core.training.state import from_bytes


class OverlayStore:
    """Reads from a base store, keeps every write in memory: a dry run over a real store."""

    def __init__(self, base: ArtifactStore) -> None:
        self.base = base
        self.root = base.root
        self.written: dict[str, bytes] = {}

    def put_bytes(self, data: bytes, name_hint: str = "") -> ArtifactRef:
        sha = hashlib.sha256(data).hexdigest()
        self.written[sha] = data
        return ArtifactRef(f"memory://{sha}", sha)

    def get_bytes(self, ref: ArtifactRef) -> bytes:
        if ref.sha256 in self.written:
            return self.written[ref.sha256]
        return self.base.get_bytes(ref)

    def exists(self, ref: ArtifactRef) -> bool:
        return ref.sha256 in self.written or self.base.exists(ref)


@dataclass(frozen=True)
class ArtifactVerdict:
    """One output artifact of the replayed step."""

    name: str
    recorded: str
    recomputed: str
    identical: bool
    detail: str = ""

    def line(self) -> str:
        if self.identical:
            return f"{self.name}: identical ({self.recorded[:12]})"
        return f"{self.name}: DIFFERS — {self.detail}"


@dataclass
class ReplayReport:
    run_id: str
    step: int
    verdicts: list[ArtifactVerdict] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return bool(self.verdicts) and all(v.identical for v in self.verdicts)

    @property
    def differing(self) -> list[str]:
        return [v.name for v in self.verdicts if not v.identical]


# --- first differing field ------------------------------------------------------------------
def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The path of the first field where two decoded artifacts differ (None: equal).

    Handles nested dicts/lists/tuples, tensors, numpy arrays and DataFrames (column, then row).
    """
    where = path or "<root>"
    if isinstance(a, pd.DataFrame) or isinstance(b, pd.DataFrame):
        return _table_difference(a, b, path)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{where}: tensor vs {type(b if isinstance(a, torch.Tensor) else a).__name__}"
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{where}: shape/dtype {tuple(a.shape)}/{a.dtype} vs {tuple(b.shape)}/{b.dtype}"
        if torch.equal(a, b) or (a.numel() == 0):
            return None
        idx = int(torch.nonzero(a.reshape(-1) != b.reshape(-1))[0])
        return (
            f"{where}[flat {idx}]: {a.reshape(-1)[idx].item()!r} vs {b.reshape(-1)[idx].item()!r}"
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return first_difference(np.asarray(a).tolist(), np.asarray(b).tolist(), path)
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{path}.{key}: only in {'recorded' if key in a else 'recomputed'}"
            found = first_difference(a[key], b[key], f"{path}.{key}" if path else str(key))
            if found:
                return found
        return None
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return f"{where}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    if type(a) is not type(b) or a != b:
        return f"{where}: {a!r} vs {b!r}"
    return None


def _table_difference(a: Any, b: Any, path: str) -> str | None:
    if not (isinstance(a, pd.DataFrame) and isinstance(b, pd.DataFrame)):
        return f"{path or '<table>'}: table vs {type(b).__name__}"
    if list(a.columns) != list(b.columns):
        return f"columns {list(a.columns)} vs {list(b.columns)}"
    if len(a) != len(b):
        return f"row count {len(a)} vs {len(b)}"
    for col in a.columns:
        for i, (x, y) in enumerate(zip(a[col].tolist(), b[col].tolist(), strict=True)):
            found = first_difference(x, y, f"column {col!r} row {i}")
            if found:
                return found
    return None


def _decode(name: str, data: bytes) -> Any:
    return read_table(data) if name in TABLES else from_bytes(data)


def compare_artifact(
    name: str, store: ArtifactStore, recorded: ArtifactRef, recomputed: bytes
) -> ArtifactVerdict:
    """Recorded ref (its stored object re-verified) vs the recomputed bytes of one artifact."""
    sha = hashlib.sha256(recomputed).hexdigest()
    try:
        stored = store.get_bytes(recorded)
    except CorruptArtifactError as exc:
        return ArtifactVerdict(
            name,
            recorded.sha256,
            sha,
            False,
            f"stored object is corrupt: {recorded.uri} hashes to {exc.actual}, "
            f"recorded {exc.expected}",
        )
    except MissingArtifactError as exc:
        return ArtifactVerdict(name, recorded.sha256, sha, False, f"stored object missing: {exc}")
    if sha == recorded.sha256:
        return ArtifactVerdict(name, recorded.sha256, sha, True)
    diff = first_difference(_decode(name, stored), _decode(name, recomputed))
    detail = f"sha256 recorded {recorded.sha256[:12]} vs recomputed {sha[:12]}; " + (
        f"first differing field: {diff}" if diff else "same decoded values, different bytes"
    )
    return ArtifactVerdict(name, recorded.sha256, sha, False, detail)


def replay_step(cfg: RunConfig, store: ArtifactStore, run_id: str, step: int) -> ReplayReport:
    """Recompute ``step`` of ``run_id`` from the state recorded for ``step - 1``.

    With a non-simulated executor the recorded rollout tables are the truth (an LLM service is
    not bit-reproducible) and only what is downstream of them is recomputed and compared.
    """
    if step < 1:
        raise ValueError(f"step must be >= 1 (step 0 is the initial state), got {step}")
    index = RunIndex(store, run_id)
    recorded = index.step_artifacts(step)
    missing = [n for n in step_artifacts(cfg) if n not in recorded]
    if missing:
        raise MissingArtifactError(
            f"run {run_id} step {step} lacks recorded artifacts {missing} in {store.root}"
        )
    previous = index.lookup(step - 1, "state")
    overlay = OverlayStore(store)
    rollouts = None
    if cfg.executor.kind != "sim":
        rollouts = {name: recorded[name] for name in ("trajectories", "decisions")}
    refs = run_step(cfg, StepStore(overlay), previous, step, rollouts)
    report = ReplayReport(run_id, step)
    for name in step_artifacts(cfg):
        report.verdicts.append(
            compare_artifact(name, store, recorded[name], overlay.get_bytes(refs[name]))
        )
    return report
