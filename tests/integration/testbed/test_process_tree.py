"""The drills' kill -9 takes a driver's whole tree, as a pod's death does, including a worker that moved itself
into a process group of its own as PySpark's daemon does (a `killpg` of the driver's group leaves that one
running: CI saw it finish a commit and write into a checkpoint the drill had just deleted)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from handoff_testbed.eventually import eventually
from handoff_testbed.process_tree import kill_tree, process_tree, running

# driver -> "JVM" -> "daemon" (own process group) -> "worker" that forks a new child every 10 ms
TREE = r"""
import os, sys, time
if os.fork() == 0:                      # the JVM
    if os.fork() == 0:                  # the daemon, in a process group of its own
        os.setpgid(0, 0)
        while True:
            if os.fork() == 0:          # a worker, short-lived
                time.sleep(0.5); os._exit(0)
            time.sleep(0.01)
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                pass
    while True:
        time.sleep(1)
open(sys.argv[1], "w").close()
while True:
    time.sleep(1)
"""


def _start(tmp_path: Path) -> subprocess.Popen[bytes]:
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", TREE, str(ready)], start_new_session=True)
    eventually(lambda: ready.exists() and len(process_tree(proc.pid)) >= 4, "the tree started", timeout=30)
    return proc


def _other_groups(tree: set[tuple[int, str]], pgid: int) -> set[tuple[int, str]]:
    out = set()
    for pid, start in tree:
        try:
            if os.getpgid(pid) != pgid:
                out.add((pid, start))
        except ProcessLookupError:
            pass
    return out


def test_killpg_alone_leaves_the_daemons_group_running(tmp_path: Path) -> None:
    """Why kill_tree exists: the model of the daemon escapes a kill of the driver's process group."""
    proc = _start(tmp_path)
    tree = process_tree(proc.pid)
    escaped = _other_groups(tree, proc.pid)
    try:
        assert escaped
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(0.5)
        assert running(escaped)
    finally:
        for pid, _ in running(escaped):
            kill_tree(pid)


def test_kill_tree_takes_every_process_whatever_its_group(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    tree = process_tree(proc.pid)
    assert _other_groups(tree, proc.pid)
    daemon_pgids = {os.getpgid(pid) for pid, _ in _other_groups(tree, proc.pid)}
    kill_tree(proc.pid)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not running(tree)
    # nothing the daemon forked meanwhile survived either: its process group is empty
    for pgid in daemon_pgids:
        alive = [p for p in Path("/proc").glob("[0-9]*/stat")
                 if (f := _fields(p)) is not None and int(f[2]) == pgid and f[0] != "Z"]
        assert alive == [], alive


def _fields(stat: Path) -> list[str] | None:
    try:
        return stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
