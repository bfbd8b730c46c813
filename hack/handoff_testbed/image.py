"""Builds the project's image (Dockerfile) here, from Debian packages, and caches it by its inputs.

No container registry is reachable from these machines, so `python:3.11-slim-bookworm` cannot be
pulled. The base is made instead from the Debian mirror apt already uses: `debootstrap --variant=minbase
bookworm` into a directory, imported as `local/debian:bookworm`, and passed as the Dockerfile's `BASE`
build argument (users elsewhere keep the public default).

PyPI is reachable from this machine only through its configured certificate bundle, which a build
container does not have; so the runtime dependencies are fetched on the host (`pip wheel`, once per
lock) into a wheelhouse that the build reads from a loopback HTTP server (`--network host`,
`PIP_OPTIONS=--no-index --find-links ...`): the image gets exactly the versions of requirements.lock.

The result is a `docker save` tarball in the cache, named by a hash of everything the build reads (the
Dockerfile, docker/, pyproject.toml, requirements.lock, operator/, spark_app/, the base): when that
tarball exists, `build_image()` returns at once without starting Docker, so a second `make image` with
unchanged inputs costs a hash of the sources. The tarball is what the test-bed node imports into its
containerd. `python -m handoff_testbed.image` prints the image reference (`make image`).
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import http.server
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .docker_engine import DockerEngine
from .host_state import mounts_under, unmount
from .paths import REPO_ROOT, cache_dir

REPOSITORY = "ghcr.io/handoff-io/handoff"  # the chart's image.repository
BASE_REF = "local/debian:bookworm"
SUITE = "bookworm"
INPUTS = ("Dockerfile", ".dockerignore", "docker", "pyproject.toml", "setup.py", "requirements.lock", "operator",
          "spark_app")
DEFAULT_MIRROR = "http://deb.debian.org/debian"


@dataclass(frozen=True)
class Image:
    ref: str  # e.g. ghcr.io/handoff-io/handoff:dev-0123456789ab
    tarball: Path  # `docker save` output, for `ctr images import`


def images_dir() -> Path:
    path = cache_dir() / "images"
    path.mkdir(parents=True, exist_ok=True)
    return path


def debian_mirror() -> str:
    """The Debian mirror of apt's own sources (deb822 `URIs:` of the stanza serving bookworm)."""
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for source in sources:
        for stanza in source.read_text().split("\n\n"):
            fields = dict(line.split(":", 1) for line in stanza.splitlines()
                          if ":" in line and not line.startswith("#"))
            suites = fields.get("Suites", "").split()
            if SUITE in suites and "debian" in fields.get("URIs", ""):
                return fields["URIs"].split()[0]
    for line in Path("/etc/apt/sources.list").read_text().splitlines() if Path(
            "/etc/apt/sources.list").exists() else []:
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
            return parts[1]
    return DEFAULT_MIRROR


def input_hash() -> str:
    """Hash of every file the Dockerfile build reads, plus the base; bytecode caches and the extension an editable
    install built in the tree (.dockerignore keeps it out of the build) excluded."""
    digest = hashlib.sha256(f"base={BASE_REF} mirror={debian_mirror()}\n".encode())
    for name in INPUTS:
        root = REPO_ROOT / name
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            rel = path.relative_to(REPO_ROOT)
            if "__pycache__" in rel.parts or rel.suffix in (".pyc", ".so") or ".egg-info" in str(rel):
                continue
            digest.update(f"{rel}\0{path.stat().st_mode & 0o111}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def base_rootfs_tarball() -> Path:
    """debootstrap's minbase bookworm as a tarball (cached; ~90 s the first time)."""
    tarball = images_dir() / f"debian-{SUITE}-minbase.tar"
    if tarball.exists():
        return tarball
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    if not Path(debootstrap).exists():
        raise RuntimeError("the image build needs debootstrap: apt-get install debootstrap")
    rootfs = images_dir() / f".rootfs-{SUITE}"
    shutil.rmtree(rootfs, ignore_errors=True)
    try:
        result = subprocess.run([debootstrap, "--variant=minbase", SUITE, str(rootfs), debian_mirror()],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"debootstrap failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
        # The image's apt must use the same mirror (debootstrap writes it to sources.list).
        tmp = tarball.with_suffix(".tmp")
        subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tmp), "."], check=True)
        tmp.rename(tarball)
    finally:
        for point in mounts_under(rootfs):  # debootstrap mounts /proc, /sys in the target
            unmount(point)
        shutil.rmtree(rootfs, ignore_errors=True)
    return tarball


def wheelhouse() -> Path:
    """Wheels of the image's runtime dependencies (as pinned by requirements.lock) and of the package
    build's backend, made on the host with pip (cached per lock and dependency list)."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    requirements = [*pyproject["project"]["dependencies"], *pyproject["build-system"]["requires"]]
    digest = hashlib.sha256((REPO_ROOT / "requirements.lock").read_bytes())
    digest.update("\n".join(requirements).encode())
    path = images_dir() / f"wheelhouse-{digest.hexdigest()[:12]}"
    if (path / ".complete").exists():
        return path
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    requirements_file = path / "requirements.txt"
    requirements_file.write_text("\n".join(requirements) + "\n")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(path),
                             "--constraint", str(REPO_ROOT / "requirements.lock"),
                             "--requirement", str(requirements_file)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"pip wheel failed:\n{result.stdout[-2000:]}{result.stderr[-3000:]}")
    (path / ".complete").touch()
    for old in images_dir().glob("wheelhouse-*"):
        if old != path:
            shutil.rmtree(old, ignore_errors=True)
    return path


def maven_repository() -> Path:
    """The jars docker/hadoop-aws-jars.txt and docker/gcs-connector-jars.txt list, in a Maven repository's layout, for
    the build's `docker/fetch_jars.py` (`--build-arg MAVEN_REPO`): Maven Central is not reachable from a build
    container here, for the reason PyPI is not. Made from the test bed's copies (handoff_testbed.jars, fetched with
    Maven on the host); the build checks every jar's sha256 against the lists."""
    from .jars import CONNECTORS, fetched

    sys.path.insert(0, str(REPO_ROOT / "docker"))
    try:
        import fetch_jars  # docker/fetch_jars.py: the list's parser
    finally:
        sys.path.pop(0)
    listings = {connector: connector.listing_path.read_text() for connector in CONNECTORS}
    digest = hashlib.sha256("".join(listings.values()).encode()).hexdigest()[:12]
    path = images_dir() / f"maven-{digest}"
    if (path / ".complete").exists():
        return path
    shutil.rmtree(path, ignore_errors=True)
    for connector, listing in listings.items():
        jars = fetched(connector)
        for jar in fetch_jars.parse(listing):
            source = jars / jar.file_name
            if not source.exists():
                raise RuntimeError(f"{source} is missing: {connector.listing_path.name} and {connector.pom} disagree")
            target = path / jar.repository_path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    (path / ".complete").touch()
    for old in images_dir().glob("maven-*"):
        if old != path:
            shutil.rmtree(old, ignore_errors=True)
    return path


@contextlib.contextmanager
def _serve(directory: Path) -> Iterator[str]:
    """A loopback HTTP server over `directory` for the build's pip (`--find-links URL`).

    On a port derived from the directory's name when that port is free: the URL is part of the pip
    step's build argument, so a port that changed from one build to the next would defeat the layer
    cache (pip would reinstall every dependency although none changed)."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    stable = 20000 + int(hashlib.sha256(directory.name.encode()).hexdigest(), 16) % 20000
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", stable), handler)
    except OSError:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass


def build_image() -> Image:
    """Build (or find in the cache) the image for the current sources."""
    tag = f"dev-{input_hash()}"
    image = Image(f"{REPOSITORY}:{tag}", images_dir() / f"handoff-{tag}.tar")
    if image.tarball.exists():
        return image
    with open(images_dir() / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image.tarball.exists():
            return image
        started = time.monotonic()
        marks: dict[str, float] = {}
        base_tar = base_rootfs_tarball()
        marks["debootstrap"] = round(time.monotonic() - started, 1)
        wheels = wheelhouse()
        marks["wheelhouse"] = round(time.monotonic() - started, 1)
        maven = maven_repository()
        with DockerEngine() as docker, _serve(wheels) as wheels_url, _serve(maven) as maven_url:
            if not docker.has_image(BASE_REF):
                with open(base_tar, "rb") as stream:
                    result = docker.call(["import", "-", BASE_REF], stdin=stream.fileno(),
                                         stdout=subprocess.DEVNULL)
                if result.returncode != 0:
                    raise RuntimeError(f"docker import {BASE_REF} failed")
            marks["base import"] = round(time.monotonic() - started, 1)
            docker.run(["build", "--network=host", "--build-arg", f"BASE={BASE_REF}",
                        "--build-arg", f"PIP_OPTIONS=--no-index --find-links {wheels_url}",
                        "--build-arg", f"MAVEN_REPO={maven_url}",
                        "-t", image.ref, str(REPO_ROOT)])
            marks["docker build"] = round(time.monotonic() - started, 1)
            tmp = image.tarball.with_suffix(".tmp")
            docker.run(["save", "-o", str(tmp), image.ref])
            tmp.rename(image.tarball)
            marks["docker save"] = round(time.monotonic() - started, 1)
            # Older builds' tarballs and images are dead weight (each ~1 GB).
            for old in images_dir().glob("handoff-dev-*.tar"):
                if old != image.tarball:
                    old.unlink(missing_ok=True)
                    docker.call(["rmi", f"{REPOSITORY}:{old.stem.removeprefix('handoff-')}"], quiet=True)
        (images_dir() / "build-seconds").write_text(
            " ".join(f"{k}={v}" for k, v in marks.items()) + "\n")
    return image


def main() -> int:
    # Stopped by a signal, still stop the private dockerd (the `finally` blocks only run on an exception).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    image = build_image()
    print(f"# {image.ref} ({image.tarball}, {time.monotonic() - started:.1f}s)", file=sys.stderr)
    print(image.ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
