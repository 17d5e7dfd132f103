"""Which code ran: the package version, the cache version, a hash of the installed source, and
the git commit.

An MLflow run (and a registered adapter) carries these as tags, so a run handed to another team
names the code that produced it. The code hash is computed from the files of the installed
packages themselves, so it exists where there is no git checkout (a container image); the git
commit is added when the packages sit in a git work tree, with a ``dirty`` flag when the tree
has changes the commit does not hold.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path

import evosteer_core

PACKAGES = ("evosteer_core", "evosteer_flyte")
"""The installed packages whose files make up the code hash."""

SOURCE_SUFFIXES = (".py", ".yaml", ".json", ".txt")
"""Files that are code or package data (compiled caches are left out)."""

VERSION_TAG = "evosteer.version"
CODE_HASH_TAG = "evosteer.code_hash"
GIT_COMMIT_TAG = "evosteer.git_commit"
GIT_DIRTY_TAG = "evosteer.git_dirty"
CACHE_VERSION_KEY = "evosteer.cache_version"
EVALUATION_CACHE_VERSION_KEY = "evosteer.evaluation_cache_version"

CODE_VERSION = "9"
"""Bump when a task's outputs change for the same inputs (flytekit's cache ignores code)."""

CACHE_VERSION = f"{evosteer_core.__version__}-{CODE_VERSION}"
"""The ``cache_version`` of every cached Flyte task but the evaluations: the package version
and :data:`CODE_VERSION`. It lives here, not with the tasks, so the report (which loads no
flytekit) can name it."""

EVALUATION_VERSION = "1"
"""Bump when an evaluation's outputs change for the same checkpoint while training's do not
(1: test time deploys validated skills only), so cached training stays cached."""

EVALUATION_CACHE_VERSION = f"{CACHE_VERSION}-eval{EVALUATION_VERSION}"
"""The ``cache_version`` of the evaluation tasks (a benchmark's, a row's, an experiment cell's):
:data:`CACHE_VERSION` and :data:`EVALUATION_VERSION`, so a :data:`CODE_VERSION` bump reaches
them too."""


def _package_dirs() -> list[Path]:
    root = Path(evosteer_core.__file__).resolve().parent.parent
    return [root / name for name in PACKAGES if (root / name).is_dir()]


@functools.cache
def code_hash() -> str:
    """sha256 over the relative path and bytes of every source file of :data:`PACKAGES`."""
    digest = hashlib.sha256()
    for pkg in _package_dirs():
        files = sorted(p for p in pkg.rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES)
        for path in files:
            rel = path.relative_to(pkg.parent).as_posix()
            digest.update(f"{rel}\0{path.stat().st_size}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.cache
def git_state() -> tuple[str, bool] | None:
    """(commit, dirty) of the git work tree the packages are in, or None outside one."""
    where = _package_dirs()[0].parent
    tracked = _git(["ls-files", "--", f"{PACKAGES[0]}/__init__.py"], where)
    commit = _git(["rev-parse", "HEAD"], where) if tracked else None
    if not commit:  # not a checkout, or an install that merely sits inside someone's work tree
        return None
    status = _git(["status", "--porcelain", "--untracked-files=no", "--", *PACKAGES], where)
    return commit, bool(status)


def code_summary() -> dict[str, str]:
    """This code as the report shows it: :func:`code_tags` plus the cache versions."""
    return {
        **code_tags(),
        CACHE_VERSION_KEY: CACHE_VERSION,
        EVALUATION_CACHE_VERSION_KEY: EVALUATION_CACHE_VERSION,
    }


def code_tags() -> dict[str, str]:
    """The version, code hash and (in a git checkout) commit and dirty flag, as tags."""
    tags = {VERSION_TAG: evosteer_core.__version__, CODE_HASH_TAG: code_hash()}
    git = git_state()
    if git is not None:
        tags[GIT_COMMIT_TAG] = git[0]
        tags[GIT_DIRTY_TAG] = str(git[1]).lower()
    return tags
