"""The pod sandbox ("pause") image, compiled here from the Kubernetes source the Go build already has.

Every pod's network namespace is held by a pause container, and containerd pulls `registry.k8s.io/pause`
unless the image is present; no registry is reachable here. Kubernetes' own image is one static C
program, `build/pause/linux/pause.c`, which ships in the k8s.io/kubernetes module the test bed already
downloads for the kubelet. It is compiled with `gcc -static` and packed as a `docker save`-format
tarball by hand (one layer holding /pause): no Docker engine is needed for it.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

from .k8s_build import NODE_MODULE, go_binary, kubernetes_version
from .paths import cache_dir
from .proc import run

REF = "registry.k8s.io/pause:handoff-testbed"


def _pause_source() -> Path:
    """pause.c from the Go module cache (downloaded on demand; the kubelet's build needs it anyway)."""
    out = subprocess.run([go_binary(), "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"], cwd=NODE_MODULE,
                         capture_output=True, text=True, env={**os.environ, "GOFLAGS": "-mod=readonly"})
    if out.returncode != 0 or not out.stdout.strip():
        run([go_binary(), "mod", "download", "k8s.io/kubernetes"], cwd=NODE_MODULE)
        return _pause_source()
    return Path(out.stdout.strip()) / "build" / "pause" / "linux" / "pause.c"


def _tar_bytes(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _file(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    return info, data


def build_pause_image() -> Path:
    """`docker save`-format tarball of the pause image (cached per Kubernetes version)."""
    tarball = cache_dir() / f"k8s-{kubernetes_version()}" / "pause-image.tar"
    if tarball.exists():
        return tarball
    tarball.parent.mkdir(parents=True, exist_ok=True)
    binary = tarball.parent / "pause"
    run(["gcc", "-Os", "-static", "-Wall", "-o", str(binary), str(_pause_source())])
    layer = _tar_bytes([_file("pause", binary.read_bytes(), 0o755)])
    layer_digest = hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        "history": [{"created_by": "gcc -Os -static build/pause/linux/pause.c"}],
    }).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [REF],
                            "Layers": [f"{layer_digest}/layer.tar"]}]).encode()
    tmp = tarball.with_suffix(".tmp")
    tmp.write_bytes(_tar_bytes([_file(f"{layer_digest}/layer.tar", layer), _file(config_name, config),
                                _file("manifest.json", manifest)]))
    tmp.rename(tarball)
    return tarball
