"""The cache key (issue 16 item 1): what the config hash covers, the store's identity in the
run spec, the check that a cached result's objects are in the run's store, and the replay
verdict. The end-to-end scenario (two directories, a moved run folder, a deleted object) runs
real `evosteer train` commands and is marked slow; the rest runs in seconds."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pipeline_support import SMALL, count_stage_calls, isolate_flyte_cache

from evosteer_core.infra.artifacts import (
    STORE_ID_ENTRY,
    LocalStore,
    MissingArtifactError,
    RunIndex,
    object_key,
    store_id,
)
from evosteer_core.infra.config import RunConfig, config_from_dict, default_config, load_config
from evosteer_core.infra.runs import NOT_COMPUTED, OPERATIONAL_KEYS, config_hash, run_id_for
from evosteer_core.pipeline.replay import ArtifactVerdict, ReplayReport
from evosteer_flyte.cli import main as cli_main
from evosteer_flyte.tasks.spec import SpecMismatchError, StaleCacheError, make_spec
from evosteer_flyte.tasks.tracking_tasks import record_init, record_step

# --------------------------------------------------------------------------- key coverage

CANDIDATES: dict[str, list[Any]] = {
    "executor.kind": ["openai"],
    "executor.base_url": ["http://127.0.0.1:9/v1"],
    "executor.model": ["some-model"],
    "executor.api_key_env": ["SOME_KEY"],
    "executor.environment": ["textworld"],
    "executor.retriever": [{"kind": "http", "url": "http://127.0.0.1:9/search"}],
    "executor.sandbox.packages": [[]],
    "executor.serve": [{"model": "smollm2"}],
    "data.source": ["benchmarks"],
    "data.train": [[{"name": "humaneval"}]],
    "data.heldout": [[{"name": "humaneval"}]],
    "policy.backbone": ["other/backbone"],
    "policy.device": ["cuda"],
    "policy.dtype": ["bfloat16"],
    "policy.renderer": ["full"],
    "policy.lora.target_modules": [["q_proj"]],
    "policy.init": [{"kind": "sft"}],
    "train.objective": ["tb"],
    "skills.author": ["llm"],
    "budget.run_cost": [10.0],
    "budget.max_output_tokens": [256],
    "train.update_micro_batch": [8],
    "prices.currency": ["EUR"],
    "prices.models": [{"tiny": {"prompt": 1.0, "completion": 2.0}}],
}
"""Changed values for leaves the generic rule below cannot change (strings, None, lists)."""


def _leaves(d: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _changes(key: str, value: Any) -> list[Any]:
    """Candidate values other than ``value`` for one leaf, tried in order."""
    if key in CANDIDATES:
        return CANDIDATES[key]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value + 2, value - 1, 1, 2]
    if isinstance(value, float):
        return [value * 2, value / 2, value + 0.1, 0.5, 0.9, 1.0]
    if isinstance(value, list) and value and all(isinstance(x, int | float) for x in value):
        return [[x * 0.5 for x in value], [value[0] * 0.99, *value[1:]]]
    return []


def _set(data: dict, key: str, value: Any) -> dict:
    out = copy.deepcopy(data)
    *path, last = key.split(".")
    node = out
    for part in path:
        node = node[part]
    node[last] = value
    return out


OPENAI = {
    "executor.kind": "openai",
    "executor.base_url": "http://127.0.0.1:9/v1",
    "executor.model": "some-model",
}
COMPANIONS: dict[str, dict[str, Any]] = {
    "executor.kind": {k: v for k, v in OPENAI.items() if k != "executor.kind"},
    "executor.retriever": OPENAI,
    "executor.environment": OPENAI,
    "executor.serve": OPENAI,
}
"""Keys that are only valid beside others: the change is made on a baseline that has the
companions (for ``executor.kind`` itself, beside them on the default)."""


def _baseline(base: dict, key: str) -> dict:
    data = base
    for k, v in COMPANIONS.get(key, {}).items():
        if key != "executor.kind":
            data = _set(data, k, v)
    return data


def _changed_config(base: dict, key: str, value: Any) -> tuple[str, RunConfig] | None:
    """(the baseline's hash, the first valid config with leaf ``key`` changed), or None."""
    start = _baseline(base, key)
    for candidate in _changes(key, value):
        if candidate == value:
            continue
        data = _set(start, key, candidate)
        for k, v in COMPANIONS.get(key, {}).items():
            data = _set(data, k, v) if key == "executor.kind" else data
        if key == "data.source":
            data["data"]["train"] = [{"name": "humaneval"}]
        if key == "executor.serve":  # the managed server gives base_url and model
            data["executor"].update(base_url=None, model=None)
        try:
            return config_hash(config_from_dict(start)), config_from_dict(data)
        except ValueError:
            continue
    return None


def test_the_default_run_keeps_its_id_when_keys_are_added_at_defaults():
    """The README and docs name the default run by its id; keys added since (the managed
    server, concurrent node calls, ablations, the warm start) at their defaults must not move
    it (this failed when executor.serve and executor.concurrency entered the hash)."""
    assert run_id_for(default_config()) == "tiny-sim-aae405868dc8"


def test_the_hash_changes_with_every_key_that_affects_computation():
    """Every leaf of every section but the operational ones and ``train.steps`` moves the
    hash (policy, sim, anchors, budget, executor, skills, objectives, data, reward, train.*).
    A leaf no candidate can change fails the test, so a new key must be added here."""
    base = default_config().to_dict()
    unchanged, untestable = [], []
    for key, value in _leaves(base):
        if key.split(".")[0] in OPERATIONAL_KEYS or key in NOT_COMPUTED:
            continue
        found = _changed_config(base, key, value)
        if found is None:
            untestable.append(key)
        elif config_hash(found[1]) == found[0]:
            unchanged.append(key)
    assert not untestable, f"give these keys a candidate value: {untestable}"
    assert not unchanged, f"the hash ignores {unchanged}"


def test_the_hash_stays_when_only_store_tracking_prices_name_steps_or_budget_change():
    base = default_config().to_dict()
    h0 = config_hash(config_from_dict(base))
    checked = []
    for key, value in _leaves(base):
        if key.split(".")[0] not in OPERATIONAL_KEYS and key not in NOT_COMPUTED:
            continue
        for candidate in [*_changes(key, value), "other", "s3://bucket/p", "http://h:1"]:
            try:
                cfg = config_from_dict(_set(base, key, candidate))
            except ValueError:
                continue
            if cfg.to_dict() != config_from_dict(base).to_dict():
                assert config_hash(cfg) == h0, key
                checked.append(key)
                break
    # the default has no experiment section (its leaves are not there to vary): add one
    with_experiment = {**base, "experiment": {"rows": [{"name": "a"}, {"name": "b"}]}}
    assert config_hash(config_from_dict(with_experiment)) == h0
    checked.append("experiment")
    assert {k.split(".")[0] for k in checked} >= {*OPERATIONAL_KEYS, "train"}
    assert {"train.steps", "budget.run_cost"} <= set(checked)


def test_a_staged_slice_hashes_by_its_table_not_its_path(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    rows = '{"question": "q%d", "answer": ["x"]}\n'
    a.write_text(rows % 1 + rows % 2)
    b.write_text(rows % 1 + rows % 2)
    from evosteer_core.episode.world import stage_data

    def staged(path: Path, **extra) -> RunConfig:
        over = {"data.source": "benchmarks", "data.train": [{"name": "nq_open", "path": str(path)}]}
        return stage_data(load_config(None, {"store.root": str(tmp_path / "s"), **over, **extra}))

    assert config_hash(staged(a)) == config_hash(staged(b))  # same content, other path
    b.write_text(rows % 1 + rows % 3)
    assert config_hash(staged(a)) != config_hash(staged(b))  # new content, same path


# --------------------------------------------------------------------------- store identity


def test_a_store_keeps_its_id_when_moved_and_another_folder_has_its_own(tmp_path):
    first = store_id(LocalStore(tmp_path / "runs"))
    assert store_id(LocalStore(tmp_path / "runs")) == first  # written once, read back
    (tmp_path / "runs").rename(tmp_path / "moved")
    assert store_id(LocalStore(tmp_path / "moved")) == first
    assert store_id(LocalStore(tmp_path / "runs")) != first  # a new folder at the old path


def test_two_first_users_of_a_store_get_one_id(tmp_path):
    """Two processes asking a new store for its id at once (``evosteer experiment --jobs``):
    both find no id, then both write one. Forced here: the second asks, and finishes, between
    the first's read and its write. Both must go on with the same id (the code before let the
    first overwrite the second's id, so the second's cached tasks named a store id that no
    longer was the store's)."""
    root = tmp_path / "runs"
    second: list[str] = []

    class FirstAsker(LocalStore):
        def read_entry(self, key: str) -> bytes:
            try:
                return super().read_entry(key)
            except MissingArtifactError:
                if not second:
                    second.append(store_id(LocalStore(root)))
                raise

    first = store_id(FirstAsker(root))
    assert second and first == second[0] == store_id(LocalStore(root))


def test_the_run_spec_holds_the_store_id_not_the_root(tmp_path, monkeypatch):
    """Two checkouts with the default relative root ``runs`` get different specs (before:
    equal specs, so the second hit the first's cache and failed on its missing objects)."""
    specs = []
    for clone in ("clone-a", "clone-b"):
        (tmp_path / clone).mkdir()
        monkeypatch.chdir(tmp_path / clone)
        specs.append(make_spec(load_config(None, {"store.root": "runs"})))
    assert specs[0].run_id == specs[1].run_id
    assert specs[0] != specs[1]
    assert "runs" not in repr(specs[0])


def test_a_task_refuses_a_config_or_store_other_than_its_spec(tmp_path, monkeypatch):
    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    cfg = load_config(None, {"store.root": str(tmp_path / "a")})
    ref = LocalStore(tmp_path / "a").put_bytes(b"state")
    spec = make_spec(cfg)
    other = load_config(None, {"store.root": str(tmp_path / "a"), "train.seed": 7})
    with pytest.raises(SpecMismatchError, match="config_yaml hashes to"):
        record_init(spec=spec, config_yaml=other.to_yaml(), state=ref)
    elsewhere = load_config(None, {"store.root": str(tmp_path / "b")})
    assert config_hash(elsewhere) == spec.config_hash
    with pytest.raises(SpecMismatchError, match="names another store"):
        record_init(spec=spec, config_yaml=elsewhere.to_yaml(), state=ref)
    assert record_init(spec=spec, config_yaml=cfg.to_yaml(), state=ref) == ref


def test_a_config_text_is_parsed_once_a_process(tmp_path, monkeypatch):
    """Every task of a run loads the same config text: the first parses it, later ones get
    that config and hash (a fresh parse's equals); a text that fails is parsed again each time
    (its error is not kept)."""
    from evosteer_core.infra.configio import ConfigError
    from evosteer_flyte.tasks import spec as spec_module

    parses = []
    real = spec_module.config_from_dict
    monkeypatch.setattr(spec_module, "PARSED_CONFIGS", spec_module.BoundedMemo(16))
    monkeypatch.setattr(
        spec_module, "config_from_dict", lambda *a, **k: parses.append(1) or real(*a, **k)
    )
    text = load_config(None, {"store.root": str(tmp_path), "train.seed": 3}).to_yaml()
    first, digest = spec_module.parsed_config(text)
    again, digest_again = spec_module.parsed_config(text)
    assert again is first and digest_again == digest and len(parses) == 1
    fresh = load_config(None, {"store.root": str(tmp_path), "train.seed": 3})
    assert first == fresh and digest == config_hash(fresh)
    bad = text.replace("seed: 3", "seed: three")
    for _ in range(2):
        with pytest.raises(ConfigError, match="seed"):
            spec_module.parsed_config(bad)
    assert len(parses) == 3


def test_a_record_task_refuses_refs_missing_from_the_store(tmp_path, monkeypatch):
    """What a cache hit returns is checked before it is recorded: a ref whose object is gone
    fails in one line naming it and what to do (before: recorded as if present)."""
    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    cfg = load_config(None, {"store.root": str(tmp_path / "runs"), "tracking.enabled": False})
    store = LocalStore(tmp_path / "runs")
    kept, gone = store.put_bytes(b"kept"), store.put_bytes(b"gone")
    (store.path / object_key(gone.sha256)).unlink()
    with pytest.raises(StaleCacheError) as info:
        record_step(
            spec=make_spec(cfg),
            config_yaml=cfg.to_yaml(),
            mlflow_run="",
            step=1,
            refs={"state": kept, "decisions": gone},
        )
    line = str(info.value).splitlines()[-1]
    assert f"step 1: 'decisions' ({gone.sha256[:12]}) not in the store {store.root}" in line
    assert "pyflyte local-cache clear" in line and "--run-dir" in line
    assert isinstance(info.value, MissingArtifactError)
    with pytest.raises(MissingArtifactError):
        RunIndex(store, run_id_for(cfg)).lookup(1, "decisions")  # nothing was recorded


# --------------------------------------------------------------------------- replay verdict


def test_the_replay_verdict_is_identical_only_when_every_compared_artifact_is():
    same = ArtifactVerdict("state", "a" * 64, "a" * 64, True)
    differs = ArtifactVerdict("value", "b" * 64, "c" * 64, False, "x: 1 vs 2")
    assert ReplayReport("r", 1, [same, same]).identical
    assert not ReplayReport("r", 1, [same, differs]).identical
    assert not ReplayReport("r", 1, [differs]).identical
    assert not ReplayReport("r", 1, []).identical  # nothing compared is no verdict
    assert ReplayReport("r", 1, [same, differs]).differing == ["value"]


# --------------------------------------------------------------------------- end to end


def _train(run_dir: str, capsys) -> tuple[int, str]:
    sets = [
        a for k, v in {**SMALL, "tracking.enabled": False}.items() for a in ("--set", f"{k}={v}")
    ]
    capsys.readouterr()
    code = cli_main(["train", "--steps", "1", "--run-dir", run_dir, *sets])
    return code, capsys.readouterr().err


@pytest.mark.slow
def test_two_directories_a_moved_run_folder_and_a_deleted_object(tmp_path, monkeypatch, capsys):
    """One flytekit cache (one home), the relative root ``runs``: a second directory trains
    (before: MissingArtifactError from the first directory's cache hits); the moved folder
    hits the cache under its new name and a new ``runs`` at the old place recomputes; an
    object deleted from a store fails in one line saying what to do, and after clearing the
    cache the run recomputes it."""
    from flytekit.core.local_cache import LocalTaskCache

    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    calls = count_stage_calls(monkeypatch)
    a, b = tmp_path / "clone-a", tmp_path / "clone-b"
    a.mkdir(), b.mkdir()

    monkeypatch.chdir(a)
    assert _train("runs", capsys)[0] == 0
    first = sum(calls.values())
    assert first == 6

    monkeypatch.chdir(b)
    code, err = _train("runs", capsys)
    assert code == 0, err
    assert sum(calls.values()) == 2 * first  # its own store: computed, not a foreign hit
    cfg = load_config(None, {**SMALL, "store.root": str(b / "runs"), "train.steps": 1})
    refs = RunIndex(LocalStore(b / "runs"), run_id_for(cfg)).step_artifacts(1)
    assert refs and all(LocalStore(b / "runs").exists(r) for r in refs.values())

    monkeypatch.chdir(a)
    shutil.move(a / "runs", a / "archive")
    assert (a / "archive" / STORE_ID_ENTRY).is_file()
    assert _train("archive", capsys)[0] == 0
    assert sum(calls.values()) == 2 * first  # the same store under a new name: all hits
    assert _train("runs", capsys)[0] == 0
    assert sum(calls.values()) == 3 * first  # a new store at the old path: recomputed

    store = LocalStore(a / "archive")
    cfg = load_config(None, {**SMALL, "store.root": str(a / "archive"), "train.steps": 1})
    decisions = RunIndex(store, run_id_for(cfg)).lookup(1, "decisions")
    (store.path / object_key(decisions.sha256)).unlink()
    code, err = _train("archive", capsys)
    assert code == 1
    line = [ln for ln in err.splitlines() if ln.startswith("evosteer train:")][-1]
    assert f"'decisions' ({decisions.sha256[:12]}) not in the store {store.root}" in line
    assert "pyflyte local-cache clear" in line
    assert "Traceback" not in err

    LocalTaskCache.clear()
    assert _train("archive", capsys)[0] == 0
    assert store.exists(decisions)
