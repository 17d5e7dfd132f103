"""The run state carried from one training step to the next (the checkpoint, docs/method.md §1.9 step 9)."""

from __future__ import annotations

import io
from dataclasses import dataclass, field, fields
from typing import Any

import torch


@dataclass
class TrainState:
    """Everything a step needs from the previous ones; ``to_bytes`` is deterministic.

    Tensors are stored as CPU tensors; everything else is JSON-able. The RNG state of torch's
    global generator is kept too, although every draw of the loop comes from derived seeds.
    ``nonfinite_steps`` counts the steps whose update was skipped for a non-finite loss or
    gradient (``train.max_nonfinite_steps``); ``objective`` is the objective's own learned
    state (its module state dict, e.g. TB's log Z; empty for AnchorTB).
    """

    step: int
    adapter: dict[str, torch.Tensor]
    flow_head: dict[str, torch.Tensor]
    value_head: dict[str, torch.Tensor]
    outcome_heads: dict[str, torch.Tensor]
    actor_optimizer: dict[str, Any]
    pool: dict[str, Any]
    buckets: dict[str, Any]
    value_window: list[dict[str, Any]] = field(default_factory=list)
    skills: dict[str, Any] = field(default_factory=dict)
    rng_state: torch.Tensor | None = None
    nonfinite_steps: int = 0
    objective: dict[str, torch.Tensor] = field(default_factory=dict)
    counters: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """torch.save of the fields; ``objective`` only when the objective has learned state
        (TB's log Z) and ``counters`` only when there are any (CollabFlow), so the states of
        runs without them keep their bytes. The fields are saved as they are: no copy first
        (``dataclasses.asdict`` deep-copied every tensor and dict, 3/4 of the time; the same
        bytes, since the fields hold no dataclasses and no shared objects)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("objective", "counters"):
            if not data[name]:
                del data[name]
        buf = io.BytesIO()
        torch.save(data, buf)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> TrainState:
        return cls(**torch.load(io.BytesIO(data), map_location="cpu", weights_only=False))


def to_bytes(obj: Any) -> bytes:
    """Deterministic bytes of any torch-saveable object (tensors, dicts, lists, scalars)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def from_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
