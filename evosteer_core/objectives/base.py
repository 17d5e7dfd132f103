"""The objective interface: a padded batch of scored trajectories in, a loss and metrics out.

Every objective (AnchorTB, TB, tempered TB, PPO, GRPO, CTB) is an ``nn.Module`` subclass of
:class:`Objective` registered under a name, so the training step builds one with
``build_objective(name, **kwargs)`` and calls it on a :class:`TrajectoryBatch` without knowing
which it is. Learned scalars an objective owns (log Z of TB) are its module parameters.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol, TypeVar

import torch
from torch import Tensor, nn


@dataclass
class TrajectoryBatch:
    """B trajectories padded to T = max actions; trajectory b has ``lengths[b]`` ≥ 1 actions.

    State i of trajectory b (0 ≤ i ≤ lengths[b]) precedes action i; state lengths[b] is terminal.
    Padding entries (actions t ≥ lengths[b], states i > lengths[b]) are ignored by every
    objective and may hold any finite value.

    Required fields:
      delta_logp [B, T]: Δℓ_t = ℓ_θ(a_t|s_t) − ℓ_ρ(a_t|s_t), differentiable through θ.
      action_mask [B, T] bool: valid actions, exactly t < lengths[b].
      lengths [B] long: number of actions of each trajectory.
      u [B]: measured anchor u_{q,x} (no gradient is taken through it).
      c [B, T+1]: structural correction per state (no gradient).
      b [B, T+1]: b_ψ per state, differentiable through ψ (its terminal entry is overridden).
      log_reward [B]: log R_β(x).
    Optional fields (objectives name the ones they need in ``Objective.requires``):
      logp [B, T]: ℓ_θ alone; ref_logp [B, T]: ℓ_ρ; old_logp [B, T]: ℓ at rollout (PPO);
      rewards [B]: r(x) in [0, 1]; group_ids [B] long: GRPO groups (one per record);
      token_counts [B, T]: tokens per action (per-token normalisation);
      state_inputs [B, T, D]: a critic's input per decision state ([h_ρ; f] for PPO);
      action_kinds [B, T] long: the kind of each action (index into the seven kinds);
      record_index [B] long: the trajectory's record as an index into the run's training
      records in id order (a learned per-record scalar, ablation ``no_measured_flows``).
    CTB's optional fields (docs/collabflow.md §3; built by ``collabflow.ctb_batch``):
      legal_logp [B, T, A]: log π̄_θ over the legal set of each decision state, padded to A
      actions (differentiable through θ); ref_legal_logp [B, T, A]: the same under the
      director that collected the batch; legal_mask [B, T, A] bool: the legal entries;
      context_index [B] long: the context of log Z_ψ (the task cluster);
      backward_features [B, S, K, F], backward_mask [B, S, K] bool, backward_choice [B, S]
      long: the unbuilding of each team (S steps, K removable components, F features);
      log_backward [B]: Σ_t log b of a backward kernel without parameters (uniform).
    """

    delta_logp: Tensor
    action_mask: Tensor
    lengths: Tensor
    u: Tensor
    c: Tensor
    b: Tensor
    log_reward: Tensor
    logp: Tensor | None = None
    ref_logp: Tensor | None = None
    old_logp: Tensor | None = None
    rewards: Tensor | None = None
    group_ids: Tensor | None = None
    token_counts: Tensor | None = None
    state_inputs: Tensor | None = None
    action_kinds: Tensor | None = None
    record_index: Tensor | None = None
    legal_logp: Tensor | None = None
    ref_legal_logp: Tensor | None = None
    legal_mask: Tensor | None = None
    context_index: Tensor | None = None
    backward_features: Tensor | None = None
    backward_mask: Tensor | None = None
    backward_choice: Tensor | None = None
    log_backward: Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.delta_logp.shape[0])

    @property
    def max_actions(self) -> int:
        return int(self.delta_logp.shape[1])

    def state_mask(self) -> Tensor:
        """[B, T+1] bool: state i of trajectory b exists (i ≤ lengths[b])."""
        idx = torch.arange(self.max_actions + 1, device=self.lengths.device)
        return idx[None, :] <= self.lengths[:, None]

    def terminal_mask(self) -> Tensor:
        """[B, T+1] bool: state i of trajectory b is its terminal state (i = lengths[b])."""
        idx = torch.arange(self.max_actions + 1, device=self.lengths.device)
        return idx[None, :] == self.lengths[:, None]

    def validate(self) -> None:
        """Raise ValueError naming the field and the expected shape or value on any mismatch."""
        if self.delta_logp.dim() != 2:
            raise ValueError(f"delta_logp: expected [B, T], got {tuple(self.delta_logp.shape)}")
        n_b, n_t = self.delta_logp.shape
        if n_b == 0 or n_t == 0:
            raise ValueError(f"delta_logp: empty batch {tuple(self.delta_logp.shape)}")
        shapes = {
            "action_mask": (n_b, n_t),
            "lengths": (n_b,),
            "u": (n_b,),
            "c": (n_b, n_t + 1),
            "b": (n_b, n_t + 1),
            "log_reward": (n_b,),
            "logp": (n_b, n_t),
            "ref_logp": (n_b, n_t),
            "old_logp": (n_b, n_t),
            "rewards": (n_b,),
            "group_ids": (n_b,),
            "token_counts": (n_b, n_t),
            "action_kinds": (n_b, n_t),
            "record_index": (n_b,),
            "context_index": (n_b,),
            "log_backward": (n_b,),
        }
        if self.state_inputs is not None:
            shapes["state_inputs"] = (n_b, n_t, int(self.state_inputs.shape[-1]))
        if self.legal_mask is not None:
            n_a = int(self.legal_mask.shape[-1])
            for name in ("legal_logp", "ref_legal_logp", "legal_mask"):
                shapes[name] = (n_b, n_t, n_a)
        if self.backward_mask is not None:
            if self.backward_mask.dim() != 3:
                raise ValueError(
                    f"backward_mask: expected [B, S, K], got {tuple(self.backward_mask.shape)}"
                )
            n_s, n_k = (int(x) for x in self.backward_mask.shape[1:])
            n_f = self.backward_features.shape[-1] if self.backward_features is not None else 0
            shapes["backward_features"] = (n_b, n_s, n_k, int(n_f))
            shapes["backward_mask"] = (n_b, n_s, n_k)
            shapes["backward_choice"] = (n_b, n_s)
        for name, shape in shapes.items():
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {tuple(value.shape)}")
        if self.lengths.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"lengths: expected an integer tensor, got {self.lengths.dtype}")
        bad = (self.lengths < 1) | (self.lengths > n_t)
        if bad.any():
            row = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"lengths[{row}] = {int(self.lengths[row])}: expected 1..{n_t} actions"
            )
        expected = torch.arange(n_t, device=self.lengths.device)[None, :] < self.lengths[:, None]
        mismatch = (self.action_mask.bool() != expected).any(dim=1)
        if mismatch.any():
            row = int(mismatch.nonzero()[0, 0])
            raise ValueError(
                f"action_mask row {row}: expected the first lengths[{row}] = "
                f"{int(self.lengths[row])} actions valid and the rest padding"
            )
        for f in fields(self):
            value = getattr(self, f.name)
            floating = isinstance(value, Tensor) and value.is_floating_point()
            if floating and not torch.isfinite(value).all():
                raise ValueError(f"{f.name}: contains non-finite values")


@dataclass
class ScoredTrajectory:
    """One trajectory of T ≥ 1 actions before padding; fields as in :class:`TrajectoryBatch`.

    Per-action tensors have shape [T], per-state ones [T+1]; scalars are 0-d tensors or floats.
    """

    delta_logp: Tensor
    u: Tensor | float
    c: Tensor
    b: Tensor
    log_reward: Tensor | float
    logp: Tensor | None = None
    ref_logp: Tensor | None = None
    old_logp: Tensor | None = None
    reward: Tensor | float | None = None
    group_id: int | None = None
    token_counts: Tensor | None = None


_PER_ACTION = ("delta_logp", "logp", "ref_logp", "old_logp", "token_counts")
_PER_STATE = ("c", "b")


def _trajectory_length(row: int, traj: ScoredTrajectory) -> int:
    """T of one trajectory, after checking every per-action/per-state field's shape."""
    if traj.delta_logp.dim() != 1 or traj.delta_logp.shape[0] < 1:
        raise ValueError(
            f"trajectory {row}: delta_logp must have shape [T] with T >= 1, "
            f"got {tuple(traj.delta_logp.shape)}"
        )
    n_t = int(traj.delta_logp.shape[0])
    expected = {name: (n_t,) for name in _PER_ACTION} | {name: (n_t + 1,) for name in _PER_STATE}
    for name, shape in expected.items():
        value = getattr(traj, name)
        if value is not None and tuple(value.shape) != shape:
            raise ValueError(
                f"trajectory {row}: {name} must have shape {shape}, got {tuple(value.shape)}"
            )
    return n_t


def collate(trajectories: Sequence[ScoredTrajectory]) -> TrajectoryBatch:
    """Pad trajectories into a validated :class:`TrajectoryBatch` (zero padding, gradients kept).

    An optional field is collated only when every trajectory has it; floats take the dtype of
    the first trajectory's ``delta_logp``.
    """
    if not trajectories:
        raise ValueError("collate: no trajectories")
    lengths = [_trajectory_length(row, traj) for row, traj in enumerate(trajectories)]
    max_t = max(lengths)
    dtype = trajectories[0].delta_logp.dtype

    def gather(name: str) -> list | None:
        values = [getattr(t, name) for t in trajectories]
        return None if any(v is None for v in values) else values

    def padded(name: str, width: int) -> Tensor | None:
        values = gather(name)
        if values is None:
            return None
        return torch.stack([nn.functional.pad(v, (0, width - v.shape[0])) for v in values])

    def stacked(name: str) -> Tensor | None:
        values = gather(name)
        return (
            None
            if values is None
            else torch.stack([torch.as_tensor(v, dtype=dtype) for v in values])
        )

    lens = torch.tensor(lengths)
    groups = gather("group_id")
    batch = TrajectoryBatch(
        delta_logp=padded("delta_logp", max_t),
        action_mask=torch.arange(max_t)[None, :] < lens[:, None],
        lengths=lens,
        u=stacked("u"),
        c=padded("c", max_t + 1),
        b=padded("b", max_t + 1),
        log_reward=stacked("log_reward"),
        logp=padded("logp", max_t),
        ref_logp=padded("ref_logp", max_t),
        old_logp=padded("old_logp", max_t),
        rewards=stacked("reward"),
        group_ids=None if groups is None else torch.tensor(groups),
        token_counts=padded("token_counts", max_t),
    )
    batch.validate()
    return batch


@dataclass
class ObjectiveOutput:
    """The scalar loss to minimise (mean over trajectories) and float metrics for tracking."""

    loss: Tensor
    metrics: dict[str, float]


class GradientSource(Protocol):
    """What a training update hands its objective: the padded batch of the step's scored
    trajectories, and the way from the gradient the loss leaves on Δℓ back to θ.

    The actor enters every objective only through ℓ_θ of the recorded actions, so the update
    builds Δℓ as a leaf tensor, the loss's gradient with respect to it is Γ_t, and
    :meth:`backprop_actor` accumulates Σ_t Γ_t ∇_θ ℓ_θ(a_t|s_t) into the actor's gradients
    (docs/method.md §1.7): one backward pass of the loss, then micro-batched re-scoring.
    """

    def batch(self) -> TrajectoryBatch:
        """The batch; ``delta_logp`` comes from a leaf tensor, learned heads keep their graph."""
        ...

    def backprop_actor(self) -> None:
        """After ``loss.backward()``: the θ-gradient from the gradient on Δℓ."""
        ...


class Objective(nn.Module):
    """Base class: subclasses set ``name`` and ``requires`` and implement :meth:`compute`.

    :meth:`from_config` builds one from a run config (override it to read settings) and
    :meth:`accumulate` is one update's gradient plumbing (override it when an objective needs
    more than its loss's gradient, e.g. a critic of its own).
    """

    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ()
    arms: ClassVar[tuple[str, ...] | None] = None
    """The rollout arms the objective trains on (None: every healthy, complete trajectory;
    the on-policy objectives PPO and GRPO train on the θ rollouts only)."""

    @classmethod
    def from_config(cls, cfg: Any, *, hidden_size: int | None = None) -> Objective:
        """The objective a run config (``RunConfig``; objectives import no config module)
        asks for (default: no settings); ``hidden_size`` is d_h of h_ρ, for objectives with
        a head over it (PPO's critic)."""
        return cls()

    def accumulate(self, source: GradientSource) -> ObjectiveOutput:
        """Loss of the step's batch, with every gradient accumulated: the objective's own
        parameters and the heads' through ``loss.backward()``, θ through the source."""
        out = self(source.batch())
        out.loss.backward()
        source.backprop_actor()
        return out

    def forward(self, batch: TrajectoryBatch) -> ObjectiveOutput:
        batch.validate()
        missing = [f for f in self.requires if getattr(batch, f) is None]
        if missing:
            raise ValueError(f"objective {self.name!r} needs batch fields {missing}")
        return self.compute(batch)

    @abstractmethod
    def compute(self, batch: TrajectoryBatch) -> ObjectiveOutput:
        """Loss and metrics of a validated batch."""


_REGISTRY: dict[str, type[Objective]] = {}

ObjectiveT = TypeVar("ObjectiveT", bound=type[Objective])


def register_objective(cls: ObjectiveT) -> ObjectiveT:
    """Class decorator: make ``cls`` buildable by its ``name``."""
    if cls.name in _REGISTRY:
        raise ValueError(f"objective name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def objective_names() -> tuple[str, ...]:
    """Registered objective names, sorted."""
    return tuple(sorted(_REGISTRY))


def build_objective(name: str, **kwargs: Any) -> Objective:
    """Instantiate the objective registered as ``name`` with ``kwargs``."""
    return _registered(name)(**kwargs)


def objective_from_config(cfg: Any, *, hidden_size: int | None = None) -> Objective:
    """The objective ``train.objective`` names, built from the config (``hidden_size``: d_h
    of h_ρ, for objectives with a head over it)."""
    return _registered(cfg.train.objective).from_config(cfg, hidden_size=hidden_size)


def _registered(name: str) -> type[Objective]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown objective {name!r}; registered: {list(objective_names())}")
    return _REGISTRY[name]


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over the entries where ``mask`` is true (0 when none)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp_min(1.0)
