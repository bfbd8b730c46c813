"""The contract every test-bed component implements."""
from __future__ import annotations

import abc
from pathlib import Path


class Component(abc.ABC):
    """A real server the tests and the demo talk to over its real protocol.

    `build()` fetches/compiles into the cache (idempotent, no server started); `start(workdir)` starts
    it on free loopback ports and returns the `NAME=value` exports clients need; `stop()` stops it.
    """

    name: str = ""

    def __init__(self) -> None:
        self.workdir: Path | None = None

    @abc.abstractmethod
    def build(self) -> None: ...

    @abc.abstractmethod
    def start(self, workdir: Path) -> dict[str, str]: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    def pids(self) -> list[int]:
        """Process-group leaders, so `testbed down` can stop a detached `testbed up`."""
        return []

    def log_files(self) -> list[Path]:
        return sorted(self.workdir.glob("*.log")) if self.workdir else []
