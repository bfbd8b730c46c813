"""The contract every test-bed component implements."""
from __future__ import annotations

import abc
import signal
import time
from pathlib import Path

from .proc import Service


class StartupClock:
    """Seconds since a component's start began, recorded per stage into its `startup_marks` (what a slow
    start spent its time on)."""

    def __init__(self, marks: dict[str, float]) -> None:
        self.started = time.monotonic()
        self.marks = marks

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def mark(self, stage: str) -> None:
        self.marks[stage] = round(self.elapsed(), 2)


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

    def start(self, workdir: Path) -> dict[str, str]:
        """Start on free ports; on failure stop what did start, because the caller (fixture, `testbed
        up`) never gets the object to clean up after a raise. Components implement `_start`."""
        try:
            return self._start(workdir)
        except BaseException:
            self.stop()
            raise

    @abc.abstractmethod
    def _start(self, workdir: Path) -> dict[str, str]: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    def pids(self) -> list[int]:
        """Process-group leaders, so `testbed down` can stop a detached `testbed up`."""
        return []

    def teardown(self, workdir: Path) -> None:
        """After `testbed down` stopped the pids: undo what the component changed outside its workdir
        (only the real node changes the host)."""

    def log_files(self) -> list[Path]:
        return sorted(self.workdir.glob("*.log")) if self.workdir else []


class ServiceComponent(Component):
    """A component that is one child process (`self.service`): stop, kill and pids are the same for all
    of them; only the stop timeout/signal differ. Components that support drills implement `_launch`
    (start the process on the existing ports, config and data) to get `restart()`/`start_again()`."""

    stop_timeout: float = 30.0
    stop_signal: int = signal.SIGTERM

    def __init__(self) -> None:
        super().__init__()
        self.service: Service | None = None

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop(timeout=self.stop_timeout, sig=self.stop_signal)
            self.service = None

    def kill(self) -> None:
        """kill -9, as a crash would."""
        if self.service is not None:
            self.service.kill()
            self.service = None

    def _launch(self) -> None:
        raise NotImplementedError(f"{self.name} cannot be restarted")

    def restart(self) -> None:
        """Graceful stop, then the same ports and data dir again."""
        self.stop()
        self.start_again()

    def start_again(self) -> None:
        """Start on the existing config and data (after `stop()` or `kill()`); no-op while running."""
        if self.service is not None and self.service.alive():
            return
        self._launch()

    def pids(self) -> list[int]:
        return [self.service.pid] if self.service and self.service.pid else []
