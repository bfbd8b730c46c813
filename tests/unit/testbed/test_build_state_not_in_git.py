"""No build state is committed: a clone must build every component from nothing.

A Maven dependency-plugin marker ("already unpacked") was once committed under hack/schema-registry/target/, so on
a machine with an empty cache `mvn dependency:unpack-dependencies` unpacked nothing and the Schema Registry's build
failed (found by a fresh-clone `make test` with nothing cached). The test bed now puts Maven's build directory
in the cache; this keeps such state out of the repository."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BUILD_DIRS = ("target", "build", "dist", "__pycache__", ".venv")


def test_no_tracked_file_lives_in_a_build_directory() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    offenders = [path for path in tracked.splitlines() if set(Path(path).parts[:-1]) & set(BUILD_DIRS)]
    assert offenders == []

