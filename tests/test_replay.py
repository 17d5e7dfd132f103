"""Replay verdicts without training: first differing field, corrupt and differing objects."""

from __future__ import annotations

import pandas as pd
import torch

from evosteer_core.infra.artifacts import LocalStore, object_key
from evosteer_core.pipeline.replay import OverlayStore, compare_artifact, first_difference
from evosteer_core.pipeline.stage_io import object_bytes, read_table, table_bytes


def _table(reward: float) -> pd.DataFrame:
    return pd.DataFrame(
        {"traj_id": ["a", "b"], "reward": [0.5, reward], "features": [[0.1, 0.2], [0.3, 0.4]]}
    )


def test_parquet_round_trip_keeps_lists_and_is_byte_stable():
    df = _table(1.0)
    data = table_bytes(df)
    assert table_bytes(read_table(data)) == data
    back = read_table(data)
    assert back["features"].tolist() == [[0.1, 0.2], [0.3, 0.4]]
    assert isinstance(back["features"].iloc[0], list)


def test_first_difference_names_the_field():
    assert first_difference(_table(1.0), _table(1.0)) is None
    assert first_difference(_table(1.0), _table(0.0)) == "column 'reward' row 1: 1.0 vs 0.0"
    a = {"adapter": {"w": torch.zeros(3)}, "metrics": {"loss": 1.0}}
    b = {"adapter": {"w": torch.tensor([0.0, 2.0, 0.0])}, "metrics": {"loss": 1.0}}
    assert first_difference(a, b) == "adapter.w[flat 1]: 0.0 vs 2.0"
    assert first_difference({"x": [1, 2]}, {"x": [1, 2, 3]}) == "x: length 2 vs 3"
    assert first_difference({"x": 1}, {"y": 1}) == ".x: only in recorded"
    assert first_difference({"m": float("nan")}, {"m": float("nan")}) is None


def test_compare_identical_differing_and_corrupt(tmp_path):
    store = LocalStore(tmp_path)
    recorded = store.put_bytes(object_bytes({"metrics": {"loss": 1.0}}))
    same = compare_artifact("update", store, recorded, object_bytes({"metrics": {"loss": 1.0}}))
    assert same.identical and same.line().startswith("update: identical")

    other = compare_artifact("update", store, recorded, object_bytes({"metrics": {"loss": 2.0}}))
    assert not other.identical
    assert "first differing field: metrics.loss: 1.0 vs 2.0" in other.detail

    table_ref = store.put_bytes(table_bytes(_table(1.0)))
    diff = compare_artifact("trajectories", store, table_ref, table_bytes(_table(0.0)))
    assert "column 'reward' row 1" in diff.detail

    path = tmp_path / object_key(recorded.sha256)
    path.write_bytes(path.read_bytes() + b"x")
    bad = compare_artifact("update", store, recorded, object_bytes({"metrics": {"loss": 1.0}}))
    assert not bad.identical and "corrupt" in bad.detail


def test_overlay_store_never_writes_to_its_base(tmp_path):
    base = LocalStore(tmp_path)
    kept = base.put_bytes(b"input")
    overlay = OverlayStore(base)
    ref = overlay.put_bytes(b"recomputed")
    assert overlay.get_bytes(ref) == b"recomputed" and overlay.get_bytes(kept) == b"input"
    assert not base.exists(ref)
