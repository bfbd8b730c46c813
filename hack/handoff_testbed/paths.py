"""Where the test bed caches what it builds or downloads, and where `testbed up` keeps its state.

The cache is shared by `make demo`, `make test` and `hack/testbed` so a second run reuses the
first run's jars, Go builds and virtualenvs.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
HACK_DIR = REPO_ROOT / "hack"


def cache_dir() -> Path:
    """`$HANDOFF_CACHE`, else `$XDG_CACHE_HOME/handoff`, else `~/.cache/handoff`."""
    explicit = os.environ.get("HANDOFF_CACHE")
    if explicit:
        root = Path(explicit)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg) if xdg else Path.home() / ".cache") / "handoff"
    root.mkdir(parents=True, exist_ok=True)
    return root


def state_dir() -> Path:
    """Runtime state of `hack/testbed up` (pids, logs, data dirs); removed by `hack/testbed down`."""
    path = Path(os.environ.get("HANDOFF_TESTBED_STATE", REPO_ROOT / ".testbed"))
    path.mkdir(parents=True, exist_ok=True)
    return path
