"""The container images of the Flyte tasks and their tag: a hash of what the images are built from.

``containers/images.yaml`` names the registry, one repository and Dockerfile per task kind and
the build inputs the Dockerfiles copy (``tag_inputs``). Every image is tagged
``<package version>-<code hash>``, the hash covering the Dockerfiles and every file under the
build inputs (package sources, ``pyproject.toml``, ``constraints.txt``, configs): changed code or
dependencies get a new tag, so a registration never points at an image built from older code.

Where the references come from (:func:`task_images`):

* inside an image built by ``containers/build_images.py``: the environment variable
  :data:`IMAGES_ENV`, written at build time, so a pod compiling a dynamic workflow names
  exactly the images it was registered with, whatever code it runs;
* in a checkout: ``containers/images.yaml`` and the hash of the checkout;
* neither (an installed package without its repository): ``None``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

import evosteer_core

REPO = Path(__file__).resolve().parents[1]
IMAGES_FILE = REPO / "containers" / "images.yaml"
IMAGES_ENV = "EVOSTEER_IMAGES"
"""``kind=reference,kind=reference,...``: the references an image was built with."""

IGNORED_DIRS = {"__pycache__"}
IGNORED_SUFFIXES = {".pyc"}
"""What ``.dockerignore`` keeps out of the build inputs (tests check the two agree)."""


@dataclass(frozen=True)
class ImageRef:
    """One image: its task kind, Dockerfile (relative to the repository) and reference."""

    kind: str
    dockerfile: str
    repository: str
    tag: str

    @property
    def reference(self) -> str:
        return f"{self.repository}:{self.tag}"


def input_files(root: Path, paths: list[str]) -> list[str]:
    """Every file under ``paths`` (files or folders, relative to ``root``), sorted, as POSIX
    paths relative to ``root``; caches and byte code are left out as the build context does."""
    found = set()
    for rel in paths:
        top = root / rel
        for path in [top] if top.is_file() else top.rglob("*"):
            if path.is_file() and not (
                IGNORED_DIRS & set(path.relative_to(root).parts) or path.suffix in IGNORED_SUFFIXES
            ):
                found.add(path.relative_to(root).as_posix())
    return sorted(found)


def code_hash(root: Path, paths: list[str]) -> str:
    """sha256 over ``path NUL sha256(content) LF`` of every input file, in path order."""
    digest = hashlib.sha256()
    for rel in input_files(root, paths):
        content = hashlib.sha256((root / rel).read_bytes()).hexdigest()
        digest.update(f"{rel}\0{content}\n".encode())
    return digest.hexdigest()


def load_images(path: Path = IMAGES_FILE, root: Path = REPO) -> list[ImageRef]:
    """The images of ``images.yaml``, tagged with the code hash of ``root``; a missing field
    or file names the entry."""
    data = yaml.safe_load(path.read_text())
    try:
        registry, inputs, images = data["registry"], list(data["tag_inputs"]), data["images"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: expected keys registry, tag_inputs, images ({exc})") from exc
    for rel in inputs:
        if not (root / rel).exists():
            raise ValueError(f"{path}: tag_inputs: {rel} not found")
    dockerfiles = []
    for kind, entry in images.items():
        missing = {"dockerfile", "repository"} - set(entry or {})
        if missing:
            raise ValueError(f"{path}: images.{kind}: missing {sorted(missing)}")
        if not (root / entry["dockerfile"]).is_file():
            raise ValueError(f"{path}: images.{kind}.dockerfile: {entry['dockerfile']} not found")
        dockerfiles.append(entry["dockerfile"])
    tag = f"{evosteer_core.__version__}-{code_hash(root, inputs + dockerfiles)[:12]}"
    return [
        ImageRef(kind, entry["dockerfile"], f"{registry.rstrip('/')}/{entry['repository']}", tag)
        for kind, entry in images.items()
    ]


def images_env(images: list[ImageRef]) -> str:
    """The value of :data:`IMAGES_ENV` an image is built with."""
    return ",".join(f"{i.kind}={i.reference}" for i in images)


def parse_images_env(value: str) -> dict[str, str]:
    """:data:`IMAGES_ENV` back to ``{kind: reference}``; a malformed entry names itself."""
    out = {}
    for item in value.split(","):
        kind, sep, ref = item.partition("=")
        if not (sep and kind and ref):
            raise ValueError(f"{IMAGES_ENV}: expected kind=reference, got {item!r}")
        out[kind] = ref
    return out


def task_images() -> dict[str, str] | None:
    """``{kind: reference}`` of the running image, else of this checkout, else ``None``."""
    if value := os.environ.get(IMAGES_ENV):
        return parse_images_env(value)
    if IMAGES_FILE.is_file():
        return {i.kind: i.reference for i in load_images()}
    return None
