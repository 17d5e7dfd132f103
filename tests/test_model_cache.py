"""Model cache folders: atomic publication, completion marks, races and failures."""

from __future__ import annotations

import pytest

from evosteer_core.infra.model_cache import is_complete, publish_folder


def test_publish_writes_files_and_mark_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "cache" / "model"
    out = publish_folder(target, "done.txt", "v1\n", lambda d: (d / "w.bin").write_bytes(b"x"))
    assert out == target and is_complete(target, "done.txt")
    assert (target / "w.bin").read_bytes() == b"x" and (target / "done.txt").read_text() == "v1\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["model"]
    assert target.stat().st_mode & 0o777 == 0o755


def test_a_second_writer_keeps_the_first_folder(tmp_path):
    target = tmp_path / "model"
    publish_folder(target, "done.txt", "first\n", lambda d: (d / "w.bin").write_bytes(b"1"))
    publish_folder(target, "done.txt", "second\n", lambda d: (d / "w.bin").write_bytes(b"2"))
    assert (target / "w.bin").read_bytes() == b"1"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_failed_fill_or_a_foreign_folder_is_never_complete(tmp_path):
    def broken(folder):
        (folder / "half.bin").write_bytes(b"x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        publish_folder(tmp_path / "model", "done.txt", "", broken)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "x").write_text("y")
    assert not is_complete(tmp_path / "model", "done.txt")
    with pytest.raises(OSError):
        publish_folder(tmp_path / "model", "done.txt", "", lambda d: None)
