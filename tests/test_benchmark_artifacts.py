"""Benchmark data as artifacts (issue 16 item 4): a benchmark file is read and validated once
where a run is launched, stored as a content-addressed task table and passed by ref, so tasks
never read a path (a pod cannot see the launcher's files) and the cache keys on the data's
hash; and a store root with an unsupported URL scheme is refused in one line."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pipeline_support import isolate_flyte_cache

from evosteer_core.benchmarks.rows import BenchmarkDataError
from evosteer_core.benchmarks.schema import records_from_table_bytes
from evosteer_core.episode.world import load_records, stage_data, stored_records
from evosteer_core.infra.artifacts import LocalStore, get_json, open_store
from evosteer_core.infra.config import load_config
from evosteer_core.infra.configio import ConfigError
from evosteer_core.pipeline.stage_io import StepStore, init_artifacts
from evosteer_flyte.tasks import evaluate as eval_tasks
from evosteer_flyte.workflows.evaluate import evaluate

ROW = '{"id": "%s", "question": "who wrote %s?", "answer": ["%s"]}\n'


def _nq(path: Path, *names: str) -> Path:
    path.write_text("".join(ROW % (n, n, n) for n in names))
    return path


def _config(tmp_path: Path, train: Path, **extra):
    data = {
        "data.source": "benchmarks",
        "data.train": [{"name": "nq_open", "path": str(train), "limit": 2}],
        "data.heldout": [{"name": "nq_open", "path": str(train), "offset": 2}],
    }
    return load_config(None, {"store.root": str(tmp_path / "runs"), **data, **extra})


def test_an_unsupported_store_scheme_is_refused_in_one_line(tmp_path, monkeypatch):
    """Before: ``gs://bucket/p`` became the local folder ``./gs:/bucket/p``."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as info:
        open_store("gs://bucket/prefix")
    line = str(info.value)
    assert line.count("\n") == 0
    assert "store root 'gs://bucket/prefix': the scheme 'gs' is not supported" in line
    assert "s3://BUCKET/PREFIX" in line
    with pytest.raises(ConfigError, match="store.root: the scheme 'gs' is not supported"):
        load_config(None, {"store.root": "gs://bucket/prefix"})
    assert not (tmp_path / "gs:").exists()
    for root in ("s3://bucket/p", f"file://{tmp_path}/a", str(tmp_path / "b"), "runs"):
        assert load_config(None, {"store.root": root}).store.root == root


def test_staging_stores_the_validated_table_once_and_tasks_need_no_file(tmp_path):
    """Both slices share one file: one object. The staged config loads its records from the
    store alone (the file removed, as on a pod), and they equal the file's records."""
    src = _nq(tmp_path / "nq.jsonl", "ann", "bob", "cy")
    cfg = _config(tmp_path, src)
    expected = load_records(cfg)
    staged = stage_data(cfg)
    refs = {sl.ref for sl in (*staged.data.train, *staged.data.heldout)}
    assert len(refs) == 1 and None not in refs
    (ref,) = refs
    store = LocalStore(tmp_path / "runs")
    assert store.name_hint(ref) == "nq_open.tasks.jsonl"
    src.unlink()
    assert load_records(staged) == expected
    assert [r.record_id for r in stored_records(store, ref)] == [
        "nq_open/ann",
        "nq_open/bob",
        "nq_open/cy",
    ]
    assert stage_data(staged) == staged  # a staged config is left as it is
    sim = load_config(None, {"store.root": str(tmp_path / "runs")})
    assert stage_data(sim) is sim


def test_a_bad_row_or_a_missing_file_fails_at_staging(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(ROW % ("a", "a", "a") + '{"id": "b", "question": "", "answer": ["x"]}\n')
    with pytest.raises(BenchmarkDataError, match="bad.jsonl:2"):
        stage_data(_config(tmp_path, bad))
    with pytest.raises(BenchmarkDataError, match="gone.jsonl: benchmark file not found"):
        stage_data(_config(tmp_path, tmp_path / "gone.jsonl"))
    assert not (tmp_path / "runs" / "objects").exists()  # nothing was stored


def test_a_stored_table_is_validated_on_the_way_in(tmp_path):
    store = LocalStore(tmp_path)
    ref = store.put_bytes(b'{"record_id": "x", "source": "nq_open"}\n')
    with pytest.raises(ValueError):
        records_from_table_bytes(store.get_bytes(ref))


def test_evaluation_is_cached_on_the_data_not_the_path(tmp_path, monkeypatch):
    """The same file again: a cache hit. New content under the same path: evaluated again
    (before: a hit on the path, the old scores). The same content under another path: a
    hit. The task got the table by ref and read its records from the store."""
    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    cfg = load_config(None, {"store.root": str(tmp_path / "runs"), "tracking.enabled": False})
    state = init_artifacts(cfg, StepStore(open_store(cfg.store.root)))
    seen: Counter = Counter()

    def scores(cfg, state, benchmark, records, runs):
        seen[tuple(r.record_id for r in records)] += 1
        return [float(len(records))] * runs

    monkeypatch.setattr(eval_tasks, "benchmark_scores", scores)
    src = _nq(tmp_path / "eval.jsonl", "ann", "bob")

    def run(path: Path) -> dict:
        out = evaluate(
            config_yaml=cfg.to_yaml(),
            state=state,
            benchmarks=["nq_open"],
            paths=[str(path)],
            runs=2,
        )
        return get_json(open_store(cfg.store.root), out.table)

    first = run(src)
    assert seen == {("nq_open/ann", "nq_open/bob"): 1}
    run(src)
    assert sum(seen.values()) == 1  # hit
    _nq(src, "ann", "bob", "cy")
    third = run(src)
    assert seen[("nq_open/ann", "nq_open/bob", "nq_open/cy")] == 1  # new data: recomputed
    assert first != third
    run(_nq(tmp_path / "copy.jsonl", "ann", "bob", "cy"))
    assert sum(seen.values()) == 2  # same data elsewhere: hit
