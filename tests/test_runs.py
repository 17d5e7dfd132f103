"""Run identity (evosteer_core/infra/runs.py): one config hash, the run id, the recorded config."""

from __future__ import annotations

from pathlib import Path

from evosteer_core.infra.artifacts import LocalStore, RunIndex
from evosteer_core.infra.config import default_config, load_config
from evosteer_core.infra.runs import (
    CONFIG_ENTRY,
    config_hash,
    record_config,
    run_config,
    run_id_for,
)


def test_the_hash_ignores_where_a_run_lives_and_how_many_steps_it_runs() -> None:
    cfg = default_config()
    same = (
        {"name": "other", "store.root": "/elsewhere"},
        {"tracking.experiment": "x", "prices.cpu_hour": 0.5},
        {"train.steps": cfg.train.steps + 5},  # extending a run keeps its cache keys
    )
    for overrides in same:
        assert config_hash(load_config(None, overrides)) == config_hash(cfg), overrides
    for overrides in ({"train.seed": 43}, {"train.batch_size": 6}, {"anchors.kappa": [1, 4, 0.5]}):
        assert config_hash(load_config(None, overrides)) != config_hash(cfg), overrides


def test_the_run_id_is_the_name_and_the_first_12_hex_of_the_hash() -> None:
    cfg = load_config(None, {"name": "exp-a", "train.steps": 7})
    assert run_id_for(cfg) == f"exp-a-{config_hash(cfg)[:12]}"
    assert run_id_for(load_config(None, {"name": "exp-a", "train.steps": 9})) == run_id_for(cfg)
    assert run_id_for(load_config(None, {"name": "exp-b"})) != run_id_for(cfg)


def test_the_recorded_config_is_redacted_and_hashes_as_the_run(tmp_path: Path) -> None:
    base = {"executor.kind": "openai", "executor.model": "m", "store.root": str(tmp_path)}
    cfg = load_config(None, {**base, "executor.base_url": "http://u:SECRET@h:1/v1"})
    store = LocalStore(tmp_path)
    run_id = run_id_for(cfg)
    ref = record_config(store, run_id, cfg)
    assert RunIndex(store, run_id).lookup(0, CONFIG_ENTRY) == ref
    assert b"SECRET" not in store.get_bytes(ref)
    stored = run_config(store, run_id)
    assert stored.executor.base_url == "http://REDACTED@h:1/v1"
    assert run_id_for(stored) == run_id and config_hash(stored) == config_hash(cfg)
    longer = load_config(
        None, {**base, "executor.base_url": "http://u:S2@h:1/v1", "train.steps": 9}
    )
    assert run_id_for(longer) == run_id
    record_config(store, run_id, longer)  # an extended run replaces the entry
    assert run_config(store, run_id).train.steps == 9
