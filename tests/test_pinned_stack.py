"""The installed stack is the pinned one, and the parquet writer is part of it.

Artifacts are content-addressed; tables are parquet, whose footer names the writer's version.
On 7 Dec 2026 a fresh install took pyarrow 26.0.1 instead of 25.0.1: the same trajectories
table hashed to other bytes, so the golden hashes failed on a machine whose float bytes matched
(and every cached table of an earlier run would have missed). constraints.txt now pins every
package; these tests say which one a venv has drifted from, and that the pinned writer gives
the recorded bytes.
"""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

import pandas as pd
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from evosteer_core.pipeline.stage_io import table_bytes

CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints.txt"

TABLE_SHA256 = "b5e9076dde90edcdc908b032e11c29b3d182ced371e7d10cfbc1857fa8044164"
"""sha256 of :func:`_table`'s parquet bytes, written by the pinned pyarrow (25.0.1)."""


def _table() -> pd.DataFrame:
    """One column of each kind the trajectories and decisions tables hold."""
    return pd.DataFrame(
        {
            "traj_id": ["s1-r0", "s1-r1", "s1-r2"],
            "step": [1, 1, 1],
            "reward": [0.5, 1.0, 0.0],
            "solved": [False, True, False],
            "actions": [[3, 1], [0], [2, 2, 4]],
            "features": [[0.25, -1.5], [0.0, 2.0], [1e-3, 7.0]],
        }
    )


def _pins() -> list[Requirement]:
    lines = (ln.split("#", 1)[0].strip() for ln in CONSTRAINTS.read_text().splitlines())
    return [Requirement(ln) for ln in lines if ln]


def test_every_installed_package_is_at_its_pinned_version() -> None:
    drifted = []
    for pin in _pins():
        try:
            installed = Version(metadata.version(pin.name)).public  # 2.13.0+cpu -> 2.13.0
        except metadata.PackageNotFoundError:
            continue  # pinned for an optional install (the images, the GPU extras)
        if not pin.specifier.contains(installed, prereleases=True):
            drifted.append(f"{pin.name} {installed} (pinned {pin.specifier})")
    assert not drifted, "venv differs from constraints.txt (run `make install`): " + ", ".join(
        drifted
    )


def _required(project: str = "evosteer", extras: tuple[str, ...] = ("dev",)) -> set[str]:
    """Every distribution ``project`` (with ``extras``) requires, directly or not, on this
    interpreter (environment markers evaluated as pip would)."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    todo = [(project, extras)]
    while todo:
        name, wanted = todo.pop()
        try:
            lines = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in lines:
            req = Requirement(line)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in wanted or ("",)):
                continue
            # keyed with its extras: transformers and transformers[serving] need different sets
            dep = (canonicalize_name(req.name), tuple(sorted(req.extras)))
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return {name for name, _ in seen}


def test_everything_the_project_requires_is_pinned() -> None:
    """A requirement left to the resolver takes whatever is newest on the day of the install
    (pyarrow did, 7 Dec 2026): after adding a dependency, regenerate the pins."""
    pinned = {canonicalize_name(pin.name) for pin in _pins()}
    unpinned = sorted(_required() - pinned)
    assert not unpinned, "not pinned in constraints.txt: " + ", ".join(unpinned)


def test_the_pinned_parquet_writer_gives_the_recorded_bytes() -> None:
    """Fails with any other pyarrow (26.0.1 wrote other bytes for this table)."""
    assert hashlib.sha256(table_bytes(_table())).hexdigest() == TABLE_SHA256
