"""Model folders in the local cache, written so that no reader ever sees a partial one.

A folder is filled in a temporary sibling, marked complete, opened for shared reading and
renamed into place; concurrent writers race on the rename and the loser keeps the winner's
folder. Only a folder carrying its completion mark counts as present.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def is_complete(folder: Path, mark: str) -> bool:
    """True iff ``folder`` was fully written (it carries the completion mark file ``mark``)."""
    return (folder / mark).is_file()


def publish_folder(target: Path, mark: str, mark_text: str, fill: Callable[[Path], None]) -> Path:
    """Create ``target`` atomically: ``fill(tmp)`` writes the files into a temporary sibling,
    then the mark file ``mark`` (content ``mark_text``) is added and the folder renamed into
    place. Returns ``target``; the temporary folder is removed whatever happens."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        fill(tmp)
        (tmp / mark).write_text(mark_text)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared read-only
        for item in tmp.iterdir():
            item.chmod(0o644)
        try:
            tmp.rename(target)
        except OSError:
            # Another process finished first (rename onto a non-empty folder fails): keep theirs.
            if not is_complete(target, mark):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def cache_root() -> Path:
    """``$EVOSTEER_CACHE``, else ``~/.cache/evosteer``: where converted models and generated
    games are kept."""
    return Path(os.environ.get("EVOSTEER_CACHE", Path.home() / ".cache" / "evosteer"))
