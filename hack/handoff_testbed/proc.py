"""Process plumbing shared by every component: free ports, readiness polling, clean shutdown."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .eventually import eventually


_LISTEN_FLOOR = 10000  # below this live well-known services' ports; above it, the ephemeral range's foot


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (`ip_local_port_range`)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now, chosen *below* the ephemeral range.

    Why not bind port 0 and let the kernel pick: that port comes from the ephemeral range, which every outgoing
    connection on the machine also draws from. Between picking and the service's own bind, a Kafka client's
    source port, or a readiness probe connecting to the not-yet-listening port (Linux then may connect the socket
    to itself), can take it, and the service dies with "address already in use" (CI saw the BigQuery emulator exit
    3 that way). Ports below the range are only ever taken by a bind, so the test bed's own picks are the only
    competition, and a random pick among ~20,000 makes two parallel workers' clash negligible."""
    import random

    low, _ = ephemeral_range()
    candidates = range(_LISTEN_FLOOR, low)
    for _ in range(200 if len(candidates) > 1000 else 0):
        port = random.choice(candidates)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a range squeezed low: the kernel's pick
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


class StartupError(RuntimeError):
    """A component did not become ready; the message carries the tail of its log."""


def wait_until(check: Callable[[], bool], timeout: float, what: str, proc: "Service | None" = None,
               interval: float = 0.1) -> None:
    """Poll `check` until true (handoff_testbed.eventually); fail early with the log tail if the process died
    meanwhile. Any exception counts as "not yet": readiness probes raise while the server is still coming up."""

    def exited() -> str | None:
        if proc is None or proc.alive():
            return None
        return f"process exited with {proc.popen.returncode if proc.popen else '?'}"

    try:
        eventually(check, f"{what} ready", timeout=timeout, interval=interval, retry_on=(Exception,),
                   give_up=exited, context=proc.log_tail if proc is not None else None)
    except AssertionError as exc:
        raise StartupError(str(exc)) from None


@dataclass
class Service:
    """One child process with its own log file, started in its own session so it can be killed whole."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)
    pid: int | None = field(default=None, init=False)

    def start(self) -> "Service":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        full_env = dict(os.environ)
        if self.env:
            full_env.update(self.env)
        self.popen = subprocess.Popen(
            list(self.argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=full_env, cwd=self.cwd, start_new_session=True,
        )
        log.close()
        self.pid = self.popen.pid
        return self

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def stop(self, timeout: float = 15.0, sig: int = signal.SIGTERM) -> None:
        """Signal the whole process group, wait, then SIGKILL what is left."""
        if self.pid is None:
            return
        stop_pid(self.pid, timeout=timeout, sig=sig)
        if self.popen is not None:
            try:
                self.popen.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass

    def kill(self) -> None:
        """kill -9 the process group, as a crash would."""
        self.stop(timeout=5.0, sig=signal.SIGKILL)


def stop_pid(pid: int, timeout: float = 15.0, sig: int = signal.SIGTERM) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    except PermissionError:
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            waited, _ = os.waitpid(pid, os.WNOHANG)
            if waited == pid:
                return
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run(argv: Sequence[str], cwd: Path | None = None, env: Mapping[str, str] | None = None,
        log: Path | None = None) -> None:
    """Run a set-up step (build, download); on failure raise with its output."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    result = subprocess.run(list(argv), cwd=cwd, env=full_env, capture_output=True, text=True)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-60:])
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}):\n{tail}")
