"""A process and every descendant, wherever their process group: how the drills kill a driver as a pod dies.

Why not `killpg`: PySpark's worker daemon moves itself and its workers into a process group of their own
(`os.setpgid(0, 0)` in pyspark/daemon.py), and a Python data source's streaming commit runs in such a worker. A
`killpg` of the driver's group leaves that worker finishing the commit it was in, writing the checkpoint's side
files after the drill has "lost" the checkpoint (CI saw `handoff/recent-commits.json` reappear). A container's
death takes every process in it, so a drill's kill -9 must too. A zombie writer is drilled on purpose elsewhere."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

Proc = tuple[int, str]  # (pid, start time): a pid reused later is not the same process


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (state first), or None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_tree(root: int) -> set[Proc]:
    """`root` and its descendants now."""
    parents: dict[int, int] = {}
    started: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat(int(stat.parent.name))
        if fields is not None:
            pid = int(stat.parent.name)
            parents[pid], started[pid] = int(fields[1]), fields[19]
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in started:
            tree.add((pid, started[pid]))
            todo += [child for child, parent in parents.items() if parent == pid]
    return tree


def running(procs: set[Proc]) -> set[Proc]:
    """Those of `procs` still alive (a zombie, dead but not yet reaped, counts as gone)."""
    alive = set()
    for pid, start in procs:
        fields = _stat(pid)
        if fields is not None and fields[19] == start and fields[0] != "Z":
            alive.add((pid, start))
    return alive


def kill_tree(root: int, timeout: float = 30.0) -> None:
    """SIGKILL `root` and all its descendants, and wait until none runs.

    The tree is frozen top-down first (SIGSTOP a process, then look for its children: a stopped process forks no
    more), so a child forked meanwhile cannot escape by being re-parented to init once its parent is killed."""
    frozen: set[Proc] = set()
    todo = [root]
    while todo:
        for proc in process_tree(todo.pop()) - frozen:
            try:
                os.kill(proc[0], signal.SIGSTOP)
            except ProcessLookupError:
                continue
            frozen.add(proc)
            todo.append(proc[0])
    for pid, _ in running(frozen):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while running(frozen):
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes still running after SIGKILL: {sorted(running(frozen))}")
        time.sleep(0.05)
