"""Build (and optionally push) the pipeline's container images with the Docker SDK.

Reads containers/images.yaml, builds each image from the repository root as its context and
tags it ``<registry>/<repository>:<version>-<code hash>`` (evosteer_flyte/images.py: the hash of
the Dockerfiles and the build inputs, so new code or dependencies get a new tag). Every image
gets the references of the whole set as ``EVOSTEER_IMAGES``, so a pod names the images its
workflows were registered with. Without a reachable Docker engine it exits with status 2 and
says so (this project's CI machines have the client but no engine).

    python containers/build_images.py                 # build all
    python containers/build_images.py --only cpu --push
    python containers/build_images.py --list          # print the references, build nothing
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the images module of this checkout, installed or not

from evosteer_flyte.images import IMAGES_ENV, ImageRef, images_env, load_images  # noqa: E402

NO_ENGINE_EXIT = 2


def _engine():
    """A connected Docker client, or None with the reason printed to stderr."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env()
        client.ping()
    except DockerException as exc:
        print(
            "build_images: no Docker engine is reachable (only the client is installed here?)\n"
            f"  DOCKER_HOST and the default socket were tried: {exc}\n"
            "  Run this script on a machine with a Docker engine, or build with another tool\n"
            "  from the repository root: docker build -f containers/Dockerfile.<kind> .",
            file=sys.stderr,
        )
        return None
    return client


def build(client, spec: ImageRef, build_env: str) -> None:
    """Build one image, streaming the engine's log; a build error raises RuntimeError."""
    print(f"== building {spec.reference} from {spec.dockerfile}", flush=True)
    for chunk in client.api.build(
        path=str(REPO),
        dockerfile=spec.dockerfile,
        tag=spec.reference,
        buildargs={IMAGES_ENV: build_env},
        rm=True,
        decode=True,
    ):
        if "error" in chunk:
            raise RuntimeError(f"building {spec.reference} failed: {chunk['error']}")
        if "stream" in chunk:
            print(chunk["stream"], end="", flush=True)


def push(client, spec: ImageRef) -> None:
    """Push one image; an error reported by the registry raises RuntimeError."""
    print(f"== pushing {spec.reference}", flush=True)
    for chunk in client.images.push(spec.repository, tag=spec.tag, stream=True, decode=True):
        if "error" in chunk:
            raise RuntimeError(f"pushing {spec.reference} failed: {chunk['error']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", help="image kind to build (repeatable)")
    parser.add_argument("--push", action="store_true", help="push after building")
    parser.add_argument("--list", action="store_true", help="print kind and reference only")
    args = parser.parse_args(argv)

    specs = load_images()
    build_env = images_env(specs)  # the whole set, also when building only some
    if args.only:
        unknown = set(args.only) - {s.kind for s in specs}
        if unknown:
            parser.error(
                f"unknown image kind(s) {sorted(unknown)}; known: {[s.kind for s in specs]}"
            )
        specs = [s for s in specs if s.kind in args.only]
    if args.list:
        for spec in specs:
            print(f"{spec.kind}\t{spec.reference}\t{spec.dockerfile}")
        return 0

    client = _engine()
    if client is None:
        return NO_ENGINE_EXIT
    for spec in specs:
        build(client, spec, build_env)
        if args.push:
            push(client, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
