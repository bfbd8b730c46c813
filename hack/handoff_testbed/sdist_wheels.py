"""Wheels, built once into the cache, of the pinned packages PyPI publishes only as source distributions (pyspark).

Why: uv keeps every build of a source distribution as a new cache revision whenever the file host answers its
revalidation with a modified response, as it does here: each `uv pip install` of pyspark built it again (~18 s) and
left two revisions of ~1.4 GB each in ~/.cache/uv, 2.8 GB per fresh venv. A CI machine that builds a venv per run
filled its disk that way until the test-bed node's disk check refused to start. With the wheel here on
`--find-links`, uv takes it (a wheel wins over a source distribution of the same version) and builds nothing.

`python -m handoff_testbed.sdist_wheels` makes what is missing and prints the directory; wheels of versions the lock
no longer pins are removed.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .paths import REPO_ROOT, cache_dir

#: Pinned dependencies with no wheel on PyPI (each would be built from source by every install).
SDIST_ONLY = ("pyspark",)


def pinned_versions(lock_text: str, names: tuple[str, ...] = SDIST_ONLY) -> dict[str, str]:
    """`name==version` pins of `names` in a `uv pip compile` lock."""
    pins = {}
    for name in names:
        match = re.search(rf"^{re.escape(name)}==(\S+)", lock_text, re.MULTILINE)
        if match:
            pins[name] = match.group(1)
    return pins


def stale_wheels(files: list[str], pins: dict[str, str]) -> list[str]:
    """The wheel files of `pins`' packages at another version than the pinned one."""
    stale = []
    for name in files:
        package, _, rest = name.partition("-")
        version = rest.split("-", 1)[0]
        if package in pins and name.endswith(".whl") and version != pins[package]:
            stale.append(name)
    return stale


def wheels_dir(lock: Path = REPO_ROOT / "requirements.lock") -> Path:
    """The cache's wheel directory holding a wheel of each pinned `SDIST_ONLY` package, built with pip if missing."""
    path = cache_dir() / "wheels"
    path.mkdir(parents=True, exist_ok=True)
    pins = pinned_versions(lock.read_text())
    for package, version in pins.items():
        if not list(path.glob(f"{package}-{version}-*.whl")):
            result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
                                     str(path), f"{package}=={version}"], capture_output=True, text=True)
            if result.returncode != 0:
                raise SystemExit(f"building the {package} {version} wheel failed:\n{result.stderr[-3000:]}")
    for name in stale_wheels(sorted(p.name for p in path.iterdir()), pins):
        (path / name).unlink()
    return path


if __name__ == "__main__":
    print(wheels_dir())
