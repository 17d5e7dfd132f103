"""The reference prior of a small backbone: a warm start of ρ's weights (docs/warm_start.md).

An instruction-tuned LLM orchestrates sensibly before any EvoSteer step; a from-scratch tiny
backbone samples almost uniformly among legal actions. ``policy.init: {kind: sft, ...}``
stands in for that instruction tuning: demonstrations are searched on *training* tasks only
(the held-out split is never loaded: ``world_for(cfg, load_split(cfg, "train"), [])``), and every
weight of the backbone is fitted to them by maximum likelihood. The fitted weights are ρ's
(the reference); θ = those weights + a LoRA adapter that starts at zero (docs/method.md §1.6).

Demonstrations (best-of-N search, all draws seeded from ``policy.init.seed``): for each of
the first ``tasks_per_family`` training tasks of every family, ``candidates`` action sequences
of the uniformly random legal policy, each charged as a rollout charges its decisions and
rendered as a rollout renders them; each sequence is scored by its mean reward over its own
episode and ``replays`` open-loop replays under fresh executor draws; the ``keep`` best
sequences of the task that succeeded at least once give their sampled decisions (those with
more than one legal action). The fit: Adam over the backbone's parameters on the restricted
log-likelihood of each demonstrated action (the grammar-trie scoring of ``policy.scoring``,
with the adapter disabled), ``epochs`` passes in a seeded order.

The weights are stored as a content-addressed artifact (:func:`stage_warm_start`), whose ref
the run's config carries as ``policy.init.ref``; ``policy.backbone.load_policy`` reads it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from evosteer_core.episode.actions import Action
from evosteer_core.episode.features import execution_features
from evosteer_core.episode.records import FAMILIES, TaskRecord
from evosteer_core.episode.runtime import DecisionCharge, Episode, replay_open_loop
from evosteer_core.episode.world import World, load_split, world_for
from evosteer_core.infra.artifacts import (
    ArtifactRef,
    ArtifactStore,
    MissingArtifactError,
    canonical_json,
    open_store,
)
from evosteer_core.infra.config import RunConfig, WarmStartConfig
from evosteer_core.infra.runs import slice_identity
from evosteer_core.infra.seeding import derive_seed, numpy_rng, settle_threads
from evosteer_core.paradigms.registry import paradigm
from evosteer_core.policy.backbone import Policy, backbone_weights, load_policy
from evosteer_core.policy.render import public_state, render
from evosteer_core.policy.scoring import score_actions
from evosteer_core.sim.executor import SimExecutor
from evosteer_core.training.heads import ValueHead

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Demonstration:
    """One demonstrated decision: the prompt ρ would see, the legal action texts, the action."""

    record_id: str
    prompt: str
    legal: tuple[str, ...]
    action: str


@dataclass(frozen=True)
class _Candidate:
    """A searched action sequence of one task: its decisions, charges and sampled choices."""

    actions: tuple[str, ...]
    charges: tuple[DecisionCharge, ...]
    demos: tuple[Demonstration, ...]
    first_reward: float


def warm_start_tasks(records: Sequence[TaskRecord], per_family: int) -> list[TaskRecord]:
    """The first ``per_family`` records of each family (family order of ``FAMILIES``)."""
    out: list[TaskRecord] = []
    for family in FAMILIES:
        out += [r for r in records if r.family == family][:per_family]
    return out


class _Recorder:
    """One searched episode's decisions, rendered and charged as a rollout renders and
    charges ρ's: the prompt (the run's renderer, v̂ and Δv̂ of the run's step-0 value head),
    prompt and action tokens, the simulator's decision time; forced decisions are free."""

    def __init__(self, search: _Searcher, record: TaskRecord, ep: Episode) -> None:
        self.search, self.record, self.ep = search, record, ep
        self.actions: list[str] = []
        self.charges: list[DecisionCharge] = []
        self.demos: list[Demonstration] = []
        self.previous: float | None = None

    def ask(self, legal: Sequence[Action]) -> tuple[str, int] | None:
        """The prompt of a choice among ``legal`` and its token count; None when the budget
        cannot cover the decision (the episode is finalized, as a rollout does)."""
        ep, cfg = self.ep, self.search.cfg
        value = self.search.value([float(x) for x in execution_features(ep)], self.record.family)
        change = None if self.previous is None else value - self.previous
        self.previous = value
        prompt = render(public_state(ep, value, change), cfg.policy.renderer)
        n_prompt = len(self.search.policy.tokenizer.encode_prompt(prompt))
        if n_prompt + cfg.policy.max_action_tokens > ep.ledger.tokens_left:
            ep.finalize("the budget cannot cover the next decision")
            return None
        return prompt, n_prompt

    def apply(
        self, action: Action, legal: Sequence[Action], prompt: str | None = None, n_prompt: int = 0
    ) -> None:
        """Apply ``action``; with a ``prompt`` (a choice, :meth:`ask`) it is charged and kept
        as a demonstration."""
        charge = DecisionCharge()
        text = action.to_json()
        if prompt is not None:
            n_action = len(self.search.policy.tokenizer.encode_action(text))
            clock = self.search.clock
            charge = DecisionCharge(
                n_prompt, n_action, 0.0 if clock is None else clock(n_prompt, n_action)
            )
            texts = tuple(a.to_json() for a in legal)
            self.demos.append(Demonstration(self.record.record_id, prompt, texts, text))
        self.actions.append(text)
        self.charges.append(charge)
        self.ep.apply(action, charge)

    def candidate(self) -> _Candidate:
        return _Candidate(
            tuple(self.actions),
            tuple(self.charges),
            tuple(self.demos),
            float(self.ep.reward or 0.0),
        )


class _Demonstrating:
    """An episode as a fixed paradigm drives it: reads pass through, and each action the
    paradigm applies is recorded and charged by the :class:`_Recorder` as ρ's decision. When
    the budget cannot cover a choice the episode is finalized and the paradigm's action is
    dropped (the paradigm then sees the finalizing action only, as under its own budget)."""

    def __init__(self, rec: _Recorder) -> None:
        self._rec = rec

    def __getattr__(self, name: str) -> object:
        return getattr(self._rec.ep, name)

    def apply(self, action: Action, decision: DecisionCharge | None = None) -> None:
        legal = self._rec.ep.legal_actions()
        if len(legal) == 1 or action not in legal:  # forced, or illegal: the runtime decides
            self._rec.apply(action, legal)
            return
        asked = self._rec.ask(legal)
        if asked is not None:
            self._rec.apply(action, legal, *asked)


class _Searcher:
    """Runs and scores candidate action sequences on training tasks (rollout charging):
    random legal ones and, when configured, the fixed paradigms' episodes."""

    def __init__(self, cfg: RunConfig, world: World, policy: Policy) -> None:
        self.cfg, self.world, self.policy = cfg, world, policy
        self.spec: WarmStartConfig = cfg.policy.init  # type: ignore[assignment]
        self.value_head = ValueHead(seed=derive_seed(cfg.train.seed, "value_head"))
        self.value_head.eval()
        executor = world.executor
        self.clock = executor.decision_seconds if isinstance(executor, SimExecutor) else None

    def value(self, features: list[float], family: str) -> float:
        """v̂ of a state under the run's step-0 value head (what a first rollout shows)."""
        with torch.no_grad():
            f = torch.tensor([features], dtype=torch.float32)
            return float(self.value_head(f, torch.tensor([FAMILIES.index(family)]))[0])

    def episode(self, record: TaskRecord, key: str) -> Episode:
        return Episode(
            record,
            self.world.catalogue,
            self.cfg.budget,
            self.world.executor,
            self.world.train_evaluator,
            menu=(),
            run_seed=self.spec.seed,
            episode_key=key,
        )

    def candidate(self, record: TaskRecord, index: int) -> _Candidate:
        """One uniformly random legal sequence, decided and charged as in a rollout."""
        rec = _Recorder(self, record, self.episode(record, f"warm-start/{index}"))
        rng = random.Random(derive_seed(self.spec.seed, record.record_id, index, "warm-start"))
        while not rec.ep.stopped:
            legal = rec.ep.legal_actions()
            if len(legal) == 1:
                rec.apply(legal[0], legal)
                continue
            asked = rec.ask(legal)
            if asked is not None:
                rec.apply(legal[rng.randrange(len(legal))], legal, *asked)
        return rec.candidate()

    def paradigm_candidate(self, record: TaskRecord, name: str) -> _Candidate:
        """The episode of the fixed paradigm ``name``, its decisions charged and rendered as
        ρ's would be (a paradigm itself decides for free)."""
        rec = _Recorder(self, record, self.episode(record, f"warm-start/{name}"))
        paradigm(name).run(_Demonstrating(rec))  # type: ignore[arg-type]
        return rec.candidate()

    def score(self, record: TaskRecord, index: int, cand: _Candidate) -> float:
        """Mean reward over the sequence's own episode and its open-loop replays."""
        rewards = [cand.first_reward]
        for k in range(self.spec.replays):
            ep = self.episode(record, f"warm-start/{index}/replay{k}")
            rewards.append(replay_open_loop(ep, cand.actions, cand.charges))
        return float(np.mean(rewards))


def search_demonstrations(
    cfg: RunConfig, world: World, policy: Policy
) -> tuple[list[Demonstration], dict[str, float]]:
    """The demonstrated decisions of the best searched sequences of every warm-start task
    (training records only), and summary figures (tasks, candidates' and kept sequences' mean
    score, decisions)."""
    spec = cfg.policy.init
    assert spec is not None
    search = _Searcher(cfg, world, policy)
    tasks = warm_start_tasks(world.train_records, spec.tasks_per_family)
    demos: list[Demonstration] = []
    all_scores, kept_scores = [], []
    for record in tasks:
        scored = []
        for index in range(spec.candidates):
            cand = search.candidate(record, index)
            scored.append((search.score(record, index, cand), len(cand.demos), index, cand))
        for offset, name in enumerate(spec.paradigms):
            index = spec.candidates + offset
            cand = search.paradigm_candidate(record, name)
            scored.append((search.score(record, index, cand), len(cand.demos), index, cand))
        all_scores += [s for s, *_ in scored]
        scored.sort(key=lambda x: (-x[0], x[1], x[2]))
        for s, _, _, cand in scored[: spec.keep]:
            if s > 0:
                kept_scores.append(s)
                demos += cand.demos
    summary = {
        "tasks": float(len(tasks)),
        "candidate_score": float(np.mean(all_scores)) if all_scores else 0.0,
        "kept_sequences": float(len(kept_scores)),
        "kept_score": float(np.mean(kept_scores)) if kept_scores else 0.0,
        "decisions": float(len(demos)),
    }
    return demos, summary


def fit_backbone(
    policy: Policy, demos: Sequence[Demonstration], spec: WarmStartConfig
) -> list[float]:
    """Maximum likelihood of the demonstrated actions over every backbone weight (the adapter
    disabled, so it stays at its zero start); returns each epoch's mean negative
    log-likelihood per decision."""
    base = [p for n, p in sorted(policy.model.named_parameters()) if "lora_" not in n]
    for p in base:
        p.requires_grad_(True)
    opt = torch.optim.Adam(base, lr=spec.lr)
    rng = numpy_rng(spec.seed, "warm-start-order")
    losses = []
    try:
        with torch.random.fork_rng(devices=[]):
            for _ in range(spec.epochs):
                order = rng.permutation(len(demos))
                epoch = []
                for start in range(0, len(order), spec.batch_size):
                    batch = [demos[i] for i in order[start : start + spec.batch_size]]
                    opt.zero_grad(set_to_none=True)
                    logp = score_actions(
                        policy,
                        [d.prompt for d in batch],
                        [d.action for d in batch],
                        [list(d.legal) for d in batch],
                        use_adapter=False,
                        requires_grad=True,
                    )
                    loss = -logp.mean()
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(base, 1.0)
                    opt.step()
                    epoch.append(loss.item() * len(batch))
                losses.append(float(sum(epoch) / max(1, len(demos))))
    finally:
        for p in base:
            p.requires_grad_(False)
            p.grad = None
    return losses


def warm_start_weights(cfg: RunConfig) -> tuple[bytes, dict[str, float]]:
    """The warm-started backbone's weights (``backbone.backbone_weights`` bytes) for
    ``cfg.policy.init``, and what the search and the fit measured."""
    spec = cfg.policy.init
    if spec is None:
        raise ValueError("policy.init: no warm start is configured")
    settle_threads()  # the same bytes in a fresh process and after a caller set the count
    world = world_for(cfg, load_split(cfg, "train"), [])
    policy = load_policy(replace(cfg.policy, init=None), seed=cfg.train.seed, reuse=False)
    demos, summary = search_demonstrations(cfg, world, policy)
    if not demos:
        raise ValueError(
            "policy.init: no searched sequence succeeded on any warm-start task; raise "
            "policy.init.candidates or policy.init.tasks_per_family"
        )
    losses = fit_backbone(policy, demos, spec)
    summary |= {f"nll_epoch{i + 1}": v for i, v in enumerate(losses)}
    return backbone_weights(policy.model.unload()), summary


WARM_START_SECTIONS = ("budget", "executor", "sim", "data", "reward")
"""Config sections the demonstrations depend on (besides ``policy`` and ``train.seed``)."""


def warm_start_key(cfg: RunConfig) -> str:
    """sha256 of what the warm start's weights are a function of: the ``policy`` section (its
    ``init`` spec without the ref), the world's sections (:data:`WARM_START_SECTIONS`, staged
    benchmark slices by their tables' sha256) but the held-out split's, and the run seed (the
    tiny backbone's draw and the value head shown in prompts). The cache key of the
    warm-start task."""
    data = cfg.public_dict()
    policy = dict(data["policy"])
    policy["init"] = {k: v for k, v in (policy["init"] or {}).items() if k != "ref"}
    key = {name: data[name] for name in WARM_START_SECTIONS}
    key["sim"].pop("n_heldout_per_family")  # the held-out split is never loaded
    key["data"]["train"] = [slice_identity(sl) for sl in key["data"]["train"]]
    key["data"].pop("heldout")
    key |= {"policy": policy, "seed": cfg.train.seed}
    return hashlib.sha256(canonical_json(key)).hexdigest()


def with_warm_start(cfg: RunConfig, ref: ArtifactRef) -> RunConfig:
    """``cfg`` with ``policy.init.ref`` set to the warm-start weights ``ref``."""
    assert cfg.policy.init is not None
    return replace(cfg, policy=replace(cfg.policy, init=replace(cfg.policy.init, ref=ref)))


def store_warm_start(cfg: RunConfig, store: ArtifactStore) -> tuple[ArtifactRef, dict[str, float]]:
    """Fit the warm start of ``cfg`` and store its weights (content-addressed)."""
    weights, summary = warm_start_weights(cfg)
    return store.put_bytes(weights, "warm_start.safetensors"), summary


def warm_start_entry(key: str) -> str:
    """Store entry of the in-process path's cache: the ref of the weights of warm-start key
    ``key`` (:func:`warm_start_key`), as the Flyte task's cache keeps its output."""
    return f"index/warm_start/{key}.json"


def stage_warm_start(cfg: RunConfig) -> RunConfig:
    """``cfg`` with its warm start's weights in ``policy.init.ref``: found through the store's
    :func:`warm_start_entry` of its key, else fitted, stored and entered (the in-process path;
    the train workflow runs the cached ``warm_start`` task instead). A config without
    ``policy.init``, or whose ref is set already, comes back unchanged."""
    if cfg.policy.init is None or cfg.policy.init.ref is not None:
        return cfg
    store = open_store(cfg.store.root, cfg.store.s3_endpoint)
    entry = warm_start_entry(warm_start_key(cfg))
    try:
        ref = ArtifactRef(**json.loads(store.read_entry(entry)))
        if store.exists(ref):
            return with_warm_start(cfg, ref)
    except MissingArtifactError:
        pass
    ref, summary = store_warm_start(cfg, store)
    log.info("warm start %s: %s", ref.sha256[:12], summary)
    store.write_entry(entry, canonical_json({"uri": ref.uri, "sha256": ref.sha256}))
    return with_warm_start(cfg, ref)
