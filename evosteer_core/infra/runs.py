"""Run identity: the one config hash, the run id, and what a run records at step 0 (its config,
and the code and MLflow run of its latest execution).

A run is named by what it computes, not by where it is stored or for how many steps it runs,
so re-running a config (after a crash, or with more ``train.steps``) writes to the same run
index and hits the same cache keys. Everything that keys a run (the Flyte ``RunSpec``, the run
id, the MLflow ``evosteer.config_hash`` tag) takes its hash from :func:`config_hash`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from evosteer_core.infra.artifacts import (
    ArtifactRef,
    ArtifactStore,
    MissingArtifactError,
    RunIndex,
    canonical_json,
)
from evosteer_core.infra.config import AblationConfig, RunConfig, config_from_dict
from evosteer_core.infra.configio import parse_yaml, to_plain
from evosteer_core.infra.provenance import code_summary

OPERATIONAL_KEYS = ("name", "store", "tracking", "prices", "experiment")
"""Top-level keys that say where a run is stored, logged, run or priced, not what it computes
(an ``experiment`` section says which other runs to launch: docs/experiments.md)."""

NOT_COMPUTED = ("train.steps", "budget.run_cost", "executor.concurrency")
"""Keys of computing sections that no step's result depends on: how many steps a run has,
the budget it may spend (raising either continues the same run) and how many node calls are
in flight at once (the tables are written in decision order, tests/test_concurrent_rollouts.py)."""

HASHED_WHEN_SET = (
    "executor.serve",
    "executor.serve.dtype",
    "executor.serve.engine",
    "budget.max_output_tokens",
    "train.update_micro_batch",
)
"""Keys added after runs existed, hashed only when not None, so that the configs made before
them keep their run ids: ``executor.serve`` (a config with a given ``base_url`` hashes as before
the managed server existed), ``executor.serve.dtype`` (the server's weights as stored),
``executor.serve.engine`` (``transformers serve``), ``budget.max_output_tokens`` (no cap on a
call's output) and ``train.update_micro_batch`` (the default micro-batch)."""

CONFIG_ENTRY = "config"
"""Run-index name (step 0) of the run's config YAML: replay, evaluate and report read it back."""


def config_hash(cfg: RunConfig) -> str:
    """sha256 of the canonical JSON of what a run computes.

    Left out: the operational keys (moving a run to another bucket or tracking server is the
    same run) and :data:`NOT_COMPUTED`: ``train.steps`` (no step depends on how many follow
    it, so extending a run from 3 to 4 steps keeps the cache keys of steps 1–3) and
    ``budget.run_cost`` (a run stopped by its budget resumes under a larger one). A staged
    benchmark slice is hashed by its task table's sha256, not its path, so new data under an
    old path is a new run. The warm start ``policy.init`` is hashed without its ``ref`` (the
    weights are a function of the rest of the config and of the code, like every stage's
    artifacts; the pipeline fills the ref in once the run id is known,
    ``training.warm_start``) and not at all when it is None (the run ids of configs made
    before the key existed stay). URLs
    are hashed redacted (:meth:`RunConfig.public_dict`): a changed password is the same run, and the stored config
    hashes as the run does. The ``ablation`` section is left out while every key of it is at
    its default (the full method), so runs without ablations keep the ids they had before the
    section existed; any changed key of it is hashed. The keys of :data:`HASHED_WHEN_SET`
    are left out while they are None.
    """
    data = {k: v for k, v in cfg.public_dict().items() if k not in OPERATIONAL_KEYS}
    if data["ablation"] == to_plain(AblationConfig()):
        del data["ablation"]
    for dotted in NOT_COMPUTED:
        section, key = dotted.split(".")
        data[section] = {k: v for k, v in data[section].items() if k != key}
    for dotted in HASHED_WHEN_SET:
        *parents, key = dotted.split(".")
        section = data
        for name in parents:  # a parent that is None itself (an unset serve) has no keys
            section = section.get(name) or {}
        if key in section and section[key] is None:
            del section[key]
    init = data["policy"].pop("init")
    if init is not None:
        data["policy"]["init"] = {k: v for k, v in init.items() if k != "ref"}
    for split in ("train", "heldout"):
        data["data"][split] = [slice_identity(sl) for sl in data["data"][split]]
    return hashlib.sha256(canonical_json(data)).hexdigest()


def slice_identity(sl: dict) -> dict:
    """What a benchmark slice contributes to the hash: with a stored task table (``ref``), its
    sha256 and the slice bounds (where the file or the store was is not the run); without one,
    the slice as written (so a config hashes as it did before slices had refs)."""
    ref = sl.get("ref")
    if ref is None:
        return {k: v for k, v in sl.items() if k != "ref"}
    return {**{k: v for k, v in sl.items() if k not in ("ref", "path")}, "sha256": ref["sha256"]}


def run_id_for(cfg: RunConfig) -> str:
    """The run id of a config: its name plus the first 12 hex digits of :func:`config_hash`."""
    return f"{cfg.name}-{config_hash(cfg)[:12]}"


def record_config(store: ArtifactStore, run_id: str, cfg: RunConfig) -> ArtifactRef:
    """Store the config with credentials redacted (:meth:`RunConfig.public_yaml`, which hashes
    as the run does) and record it as the run's step-0 :data:`CONFIG_ENTRY`.

    The entry is replaced on every call: an extended run differs only in ``train.steps``."""
    ref = store.put_bytes(cfg.public_yaml().encode(), "config.yaml")
    RunIndex(store, run_id).record(0, CONFIG_ENTRY, ref, replace=True)
    return ref


def run_config(store: ArtifactStore, run_id: str) -> RunConfig:
    """The config a run recorded at step 0 (:func:`record_config`)."""
    ref = RunIndex(store, run_id).lookup(0, CONFIG_ENTRY)
    source = f"{run_id}/config.yaml"
    return config_from_dict(parse_yaml(store.get_bytes(ref).decode(), source), source)


PROVENANCE_ENTRY = "provenance"
"""Run-index name (step 0) of the latest train execution's provenance: the code that ran it
(:func:`provenance.code_summary`) and the MLflow run it logged to."""


def record_provenance(
    store: ArtifactStore, run_id: str, mlflow: Mapping[str, str] | None
) -> ArtifactRef:
    """Record this code and ``mlflow`` (:meth:`RunTracker.location`, None when tracking is
    off) as the run's step-0 :data:`PROVENANCE_ENTRY`, replaced on every execution, so the
    report names them without reaching MLflow."""
    data = {"code": code_summary(), "mlflow": dict(mlflow) if mlflow else None}
    ref = store.put_bytes(canonical_json(data), "provenance.json")
    RunIndex(store, run_id).record(0, PROVENANCE_ENTRY, ref, replace=True)
    return ref


def run_provenance(store: ArtifactStore, run_id: str) -> dict | None:
    """What :func:`record_provenance` recorded, or None for a run recorded before it existed."""
    try:
        ref = RunIndex(store, run_id).lookup(0, PROVENANCE_ENTRY)
    except MissingArtifactError:
        return None
    return json.loads(store.get_bytes(ref))
