"""Stage 4 of a step: the anchor statistics, the structural buckets and one actor update.

The objective (``train.objective``) computes the loss and owns its gradient plumbing
(``Objective.accumulate``); this module gives it the step's scored trajectories as a
:class:`ScoredBatch` (a :class:`~evosteer_core.objectives.GradientSource`), then clips, steps
AdamW (or skips a non-finite update) and advances the statistics (docs/method.md §1.7, §1.9).
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import pandas as pd
import torch

from evosteer_core.anchors import StateKeys
from evosteer_core.episode.actions import KINDS, Action
from evosteer_core.evaluation.ranking import auc
from evosteer_core.infra.config import UPDATE_MICRO_BATCH, RunConfig
from evosteer_core.objectives import TrajectoryBatch
from evosteer_core.policy.trie import action_trie
from evosteer_core.training.results import ActorUpdate, Rescored, Rollouts
from evosteer_core.training.session import (
    Session,
    actor_optimizer,
    cpu_state,
    cpu_tree,
    record_slots,
)

_log = logging.getLogger(__name__)


def update_stage(
    s: Session,
    rollouts: Rollouts,
    rescored: Rescored,
    optimizer_state: dict,
    *,
    nonfinite_steps: int = 0,
) -> ActorUpdate:
    """Stage 4 (docs/method.md §1.9 steps 6–7): anchors, buckets (one step behind), one step.

    A non-finite loss or gradient norm skips the AdamW step (parameters and optimizer state
    stay as they were; the measured statistics are still recorded) and counts towards
    ``train.max_nonfinite_steps``; ``nonfinite_steps`` is the run's count before this step.
    """
    trajectories, decisions = rollouts.trajectories, rollouts.decisions
    acfg = s.anchors
    traj = trajectories.set_index("traj_id")
    natural_rho = traj[(traj["arm"] == "rho") & traj["healthy"] & traj["complete"]]
    # anchor AUC: p̂ from the pool *before* this step's rollouts, vs reference success
    anchor_auc = auc(
        [s.pool.anchor(r.record_id, r.family).p_hat for r in natural_rho.itertuples()],
        [int(x >= 0.5) for x in natural_rho["reward"]],
    )
    for r in natural_rho.itertuples():
        s.pool.add(r.record_id, r.family, float(r.reward))
    scored = traj[traj["healthy"] & traj["complete"]]
    u = {
        tid: s.pool.anchor(
            r.record_id, r.family, leave_out=float(r.reward) if tid in natural_rho.index else None
        ).u
        for tid, r in scored.iterrows()
    }
    trained = trained_trajectories(s, scored, int(trajectories["step"].iloc[0]))
    source = ScoredBatch(s, trained, decisions, rescored.table, u)
    opt = actor_optimizer(s.cfg, s.policy, s.flow_head, s.objective)
    opt.load_state_dict(optimizer_state)
    opt.zero_grad(set_to_none=True)
    started = time.perf_counter()
    out = s.objective.accumulate(source)
    params = (
        s.policy.trainable_parameters()
        + list(s.flow_head.parameters())
        + list(s.objective.parameters())
    )
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, s.cfg.train.grad_clip))
    skipped = not (math.isfinite(out.metrics["loss"]) and math.isfinite(grad_norm))
    if skipped:
        step = int(trajectories["step"].iloc[0])
        nonfinite_steps = count_nonfinite_step(
            s.cfg, step, nonfinite_steps, out.metrics["loss"], grad_norm
        )
    else:
        opt.step()
    update_s = time.perf_counter() - started
    # this step's visits go to the pending buckets, readable from the next step on
    eligible = scored[scored["arm"] != "theta"]
    by_traj = dict(tuple(decisions.groupby("traj_id", sort=False)))
    for tid, r in eligible.iterrows():
        d = by_traj[tid]
        states = [StateKeys(e, c) for e, c in zip(d["exact_key"], d["coarse_key"], strict=True)]
        states.append(StateKeys(r.terminal_exact_key, r.terminal_coarse_key))
        s.buckets.add_trajectory(states, acfg.log_reward(float(r.reward)), u[tid])
    s.buckets.commit()
    metrics = dict(out.metrics)
    metrics.update(
        anchor_auc=anchor_auc,
        grad_norm=grad_norm,
        reward_theta=float(traj[traj["arm"] == "theta"]["reward"].mean()),
        reward_rho=float(traj[traj["arm"] == "rho"]["reward"].mean()),
        n_trajectories=float(len(scored)),
        nonfinite_skipped=float(skipped),
        nonfinite_steps=float(nonfinite_steps),
    )
    if s.cfg.objectives.cost_metrics:
        metrics.update(cost_metrics(trajectories, len(trained), update_s))
    return ActorUpdate(
        adapter=s.policy.adapter_state(),
        flow_head=cpu_state(s.flow_head.state_dict()),
        actor_optimizer=optimizer_state if skipped else cpu_tree(opt.state_dict()),
        pool=s.pool.to_dict(),
        buckets=s.buckets.to_dict(),
        nonfinite_steps=nonfinite_steps,
        metrics=metrics,
        objective=cpu_state(s.objective.state_dict()),
    )


def trained_trajectories(s: Session, scored: pd.DataFrame, step: int) -> pd.DataFrame:
    """The scored trajectories of the arms the objective trains on (all of them for the TB
    family, the θ rollouts for PPO and GRPO)."""
    arms = s.objective.arms
    if arms is None:
        return scored
    trained = scored[scored["arm"].isin(arms)]
    if trained.empty:
        raise ValueError(
            f"step {step}: objective {s.objective.name!r} trains on the {'/'.join(arms)} "
            "rollouts and none of them is healthy and complete"
        )
    return trained


def cost_metrics(trajectories: pd.DataFrame, episodes: int, update_s: float) -> dict[str, float]:
    """The objective comparison's cost figures (docs/objectives.md §11): the update's wall time
    (loss, every backward pass, clipping and the AdamW step) per trained episode, and the
    rollout's tokens per problem (all of the step's episodes, θ, ρ and paired, over its
    records)."""
    return {
        "update_ms": 1000.0 * update_s,
        "update_ms_per_episode": 1000.0 * update_s / max(episodes, 1),
        "tokens_per_problem": float(trajectories["tokens"].sum())
        / max(trajectories["record_id"].nunique(), 1),
    }


class NonFiniteStepsError(RuntimeError):
    """More update steps had a non-finite loss or gradient than ``train.max_nonfinite_steps``."""


def count_nonfinite_step(
    cfg: RunConfig, step: int, before: int, loss: float, grad_norm: float
) -> int:
    """The run's count of skipped steps including this one; past the limit the run stops."""
    count = before + 1
    limit = cfg.train.max_nonfinite_steps
    what = f"step {step}: non-finite loss ({loss}) or gradient norm ({grad_norm})"
    if count > limit:
        raise NonFiniteStepsError(
            f"{what}; {count} such steps in this run exceed train.max_nonfinite_steps = "
            f"{limit}, so the run stops here (the steps before it are kept)"
        )
    _log.warning(
        "%s: AdamW step skipped (%d of at most %d such steps, train.max_nonfinite_steps)",
        what,
        count,
        limit,
    )
    return count


class ScoredBatch:
    """The step's healthy, complete trajectories as the objective sees them.

    Δℓ_t = ℓ_θ − ℓ_ρ comes from the re-scoring stage (same parameters, same prompt, tokens and
    mask) as a *leaf* tensor: the loss's gradient with respect to it is Γ_t, which
    :meth:`backprop_actor` turns into the θ-gradient Σ_t Γ_t ∇ℓ_θ (docs/method.md §1.7,
    paper A.22). b_ψ is computed with its graph, so ψ gets its gradient from the loss directly.
    """

    def __init__(
        self,
        s: Session,
        scored: pd.DataFrame,
        decisions: pd.DataFrame,
        rescored: pd.DataFrame,
        u: dict[str, float],
    ) -> None:
        self._session = s
        self._scored = scored
        d = decisions.assign(
            logp_theta=rescored["logp_theta"].to_numpy(),
            logp_rho=rescored["logp_rho"].to_numpy(),
            h_rho=rescored["h_rho"],
        )
        self.rows = d[d["traj_id"].isin(scored.index)]
        self._u = u
        self._delta: torch.Tensor | None = None

    def batch(self) -> TrajectoryBatch:
        """Pad the scored trajectories into a :class:`TrajectoryBatch` (a fresh leaf Δℓ)."""
        s, scored, d = self._session, self._scored, self.rows
        acfg = s.anchors
        # saturate at the float32 range: a finite Δℓ too large for float32 gives an infinite
        # loss (a skipped update) instead of a non-finite input
        big = float(np.finfo(np.float32).max)
        delta_all = torch.tensor(
            (d["logp_theta"] - d["logp_rho"]).clip(-big, big).to_numpy(),
            dtype=torch.float32,
            requires_grad=True,
        )
        self._delta = delta_all
        h = torch.tensor(d["h_rho"].tolist(), dtype=torch.float32)
        f = torch.tensor(d["features"].tolist(), dtype=torch.float32)
        if s.cfg.ablation.no_flow_corrections:
            # c(g) = 0 and b_ψ = 0 (docs/ablations.md): ψ gets no gradient and stays as it is
            b_states = c_states = torch.zeros(len(d), dtype=torch.float32)
        else:
            b_states = s.flow_head(h, f)
            keys = [StateKeys(e, c) for e, c in zip(d["exact_key"], d["coarse_key"], strict=True)]
            c_states = torch.tensor(s.buckets.corrections(keys), dtype=torch.float32)
        ids = list(scored.index)
        pos = {tid: i for i, tid in enumerate(ids)}
        n_b, n_t = len(ids), int(scored["n_actions"].max())
        row = torch.tensor(d["traj_id"].map(pos).to_numpy())
        col = torch.tensor(d["t"].to_numpy())
        delta = torch.zeros(n_b, n_t).index_put((row, col), delta_all)
        b = torch.zeros(n_b, n_t + 1).index_put((row, col), b_states)
        c = torch.zeros(n_b, n_t + 1).index_put((row, col), c_states)
        lengths = torch.tensor(scored["n_actions"].to_numpy(), dtype=torch.long)
        rewards = [float(x) for x in scored["reward"]]
        batch = TrajectoryBatch(
            delta_logp=delta,
            action_mask=torch.arange(n_t)[None, :] < lengths[:, None],
            lengths=lengths,
            u=torch.tensor([self._u[t] for t in ids], dtype=torch.float32),
            c=c,
            b=b,
            log_reward=torch.tensor([acfg.log_reward(x) for x in rewards], dtype=torch.float32),
            rewards=torch.tensor(rewards, dtype=torch.float32),
        )
        self._add_required(batch, delta, (row, col), h, f)
        return batch

    def _add_required(
        self,
        batch: TrajectoryBatch,
        delta: torch.Tensor,
        where: tuple[torch.Tensor, torch.Tensor],
        h: torch.Tensor,
        f: torch.Tensor,
    ) -> None:
        """The optional fields the objective names in ``requires``, and only those (the
        others stay None, so an objective that needs none gets the batch it always got).

        ``logp`` is ℓ_θ = Δℓ + ℓ_ρ with ℓ_ρ a constant: it hangs off the same leaf, so the one
        :meth:`backprop_actor` pass carries its gradient too. ``old_logp`` is the rollout's
        ``logp_sample``; ``group_ids`` number the records; ``token_counts`` count the sampled
        tokens of each action (positions with more than one allowed token, at least 1);
        ``state_inputs`` are [h_ρ; f]; ``action_kinds`` index ``KINDS``; ``record_index``
        indexes the training records in id order (``session.record_slots``).
        """
        need, d = set(self._session.objective.requires), self.rows
        n_b, n_t = delta.shape

        def per_action(values: torch.Tensor) -> torch.Tensor:
            return torch.zeros(n_b, n_t, dtype=values.dtype).index_put(where, values)

        if need & {"ref_logp", "logp"}:
            ref = per_action(torch.tensor(d["logp_rho"].to_numpy(), dtype=torch.float32))
            batch.ref_logp = ref if "ref_logp" in need else None
            batch.logp = delta + ref if "logp" in need else None
        if "old_logp" in need:
            batch.old_logp = per_action(
                torch.tensor(d["logp_sample"].to_numpy(), dtype=torch.float32)
            )
        if "group_ids" in need:
            codes = pd.factorize(self._scored["record_id"])[0]
            batch.group_ids = torch.tensor(codes, dtype=torch.long)
        if "token_counts" in need:
            batch.token_counts = per_action(torch.tensor(self._sampled_tokens(), dtype=torch.long))
        if "state_inputs" in need:
            x = torch.cat([h, f], dim=1)
            batch.state_inputs = torch.zeros(n_b, n_t, x.shape[1]).index_put(where, x)
        if "record_index" in need:
            slots = record_slots(self._session.world.train_records)
            index = [slots[r] for r in self._scored["record_id"]]
            batch.record_index = torch.tensor(index, dtype=torch.long)
        if "action_kinds" in need:
            kinds = [KINDS.index(Action.from_json(a).kind) for a in d["action"]]
            batch.action_kinds = per_action(torch.tensor(kinds, dtype=torch.long))

    def _sampled_tokens(self) -> list[int]:
        """Per decision: the positions of its action where the grammar left a choice (≥ 1)."""
        tok = self._session.policy.policy.tokenizer
        out = []
        for text, legal in zip(self.rows["action"], self.rows["legal"], strict=True):
            trie = action_trie(legal, tok)
            out.append(max(1, sum(len(a) > 1 for a in trie.path_allowed(trie.index_of(text)))))
        return out

    def backprop_actor(self) -> None:
        """Accumulate Σ_t Γ_t ∇_θ ℓ_θ(a_t|s_t) into the LoRA gradients, a micro-batch at a time.

        Only decisions with more than one legal action have a θ-dependent ℓ (a single legal
        action scores 0 under θ and ρ alike), so only those are re-scored with a graph.
        Micro-batches follow the prompts' text order, so each holds decisions of few tasks and
        their shared prompt head runs once (``score_actions``); the order is fixed, so runs
        stay bitwise. A micro-batch holds ``train.update_micro_batch`` decisions (the peak
        memory of the backward follows it).
        """
        if self._delta is None or self._delta.grad is None:
            raise RuntimeError("backprop_actor: call batch() and loss.backward() first")
        gamma, rows, policy = self._delta.grad, self.rows, self._session.policy
        chunk = self._session.cfg.train.update_micro_batch or UPDATE_MICRO_BATCH
        multi = np.flatnonzero((rows["legal"].map(len) > 1).to_numpy())
        multi = multi[np.argsort(rows["prompt"].to_numpy()[multi], kind="stable")]
        for start in range(0, len(multi), chunk):
            idx = multi[start : start + chunk]
            sub = rows.iloc[idx]
            scores = policy.score(
                sub["prompt"].tolist(),
                sub["action"].tolist(),
                sub["legal"].tolist(),
                use_adapter=True,
                requires_grad=True,
            )
            weights = gamma[torch.from_numpy(idx)].detach().to(scores.device)
            (weights * scores.float()).sum().backward()
