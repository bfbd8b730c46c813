"""A private Docker engine, started only for as long as an image build needs it.

Why not the machine's dockerd: there may be none (no systemd here), and a default dockerd changes the
host on its way up (net.ipv4.ip_forward=1, iptables FORWARD policy DROP, a docker0 bridge), which the
test bed must never leave behind. This one keeps its data under the cache (so layers are reused from
one build to the next), listens on its own socket, and is started with no bridge, no iptables and no
ip_forward: builds use the host network (`docker build --network host`), which is all a build needs.
Its containers' cgroups live under their own parent, removed when the engine stops.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from .host_state import remove_cgroup_tree
from .paths import cache_dir
from .proc import Service, wait_until

CGROUP_PARENT = "handoff-docker"


def docker_client() -> str:
    """Debian's client first: it speaks the API of Debian's dockerd (another client on PATH may not)."""
    for candidate in ("/usr/bin/docker", shutil.which("docker")):
        if candidate and Path(candidate).exists():
            return candidate
    raise RuntimeError("the image build needs Docker: apt-get install docker.io (hack/install-system-deps.sh)")


class DockerEngine:
    """`with DockerEngine() as docker: docker.run(["build", ...])`."""

    def __init__(self) -> None:
        self.root = cache_dir() / "docker"
        # Unix socket paths are limited to 108 bytes: keep the run dir short.
        self.run_dir = Path(f"/run/handoff-docker-{os.getpid()}")
        self.socket = self.run_dir / "docker.sock"
        self.service: Service | None = None

    def __enter__(self) -> "DockerEngine":
        dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
        if not Path(dockerd).exists():
            raise RuntimeError("the image build needs dockerd: apt-get install docker.io")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.service = Service("dockerd", [
            dockerd, f"--data-root={self.root / 'data'}", f"--exec-root={self.run_dir / 'exec'}",
            f"--pidfile={self.run_dir / 'dockerd.pid'}", f"--host=unix://{self.socket}",
            "--bridge=none", "--iptables=false", "--ip-forward=false", "--ip-masq=false",
            f"--cgroup-parent=/{CGROUP_PARENT}", "--storage-driver=overlay2",
            "--exec-opt=native.cgroupdriver=cgroupfs", "--log-level=warn",
        ], self.root / "dockerd.log").start()
        try:
            wait_until(lambda: self.call(["version"], quiet=True).returncode == 0, 60, "dockerd",
                       self.service, 0.2)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def call(self, args: Sequence[str], quiet: bool = False, stdin: int | None = None,
             stdout: int | None = None) -> subprocess.CompletedProcess[bytes]:
        env = {**os.environ, "DOCKER_HOST": f"unix://{self.socket}", "DOCKER_BUILDKIT": "0"}
        return subprocess.run([docker_client(), *args], env=env, stdin=stdin,
                              stdout=subprocess.DEVNULL if quiet else stdout,
                              stderr=subprocess.DEVNULL if quiet else None)

    def run(self, args: Sequence[str]) -> None:
        """Run a docker command, its output into the engine's log (the tail is raised on failure)."""
        log = self.root / f"docker-{args[0]}.log"
        with open(log, "wb") as out:
            env = {**os.environ, "DOCKER_HOST": f"unix://{self.socket}", "DOCKER_BUILDKIT": "0"}
            result = subprocess.run([docker_client(), *args], env=env, stdout=out, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            raise RuntimeError(f"docker {' '.join(args[:3])} ... failed ({result.returncode}); {log}:\n{tail}")

    def has_image(self, ref: str) -> bool:
        return self.call(["image", "inspect", ref], quiet=True).returncode == 0

    def __exit__(self, *exc: object) -> None:
        if self.service is not None:
            self.service.stop(timeout=30)
            self.service = None
        # dockerd's managed containerd and any build container's mounts are gone with it; what can be
        # left is the exec root's own mounts (netns files) and the containers' cgroups.
        with contextlib.suppress(Exception):
            _unmount_under(self.run_dir)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        remove_cgroup_tree(CGROUP_PARENT)


def _unmount_under(path: Path) -> None:
    from .host_state import mounts_under, unmount
    for target in mounts_under(path):
        unmount(target)
