"""Fault injection for the exactly-once drills — a documented test hook, inert unless `HANDOFF_FAULT` is set.

`HANDOFF_FAULT=<point>:batch=<N>[,once=<marker file>]` makes the process group die with SIGKILL (the
equivalent of `kill -9` on the whole app: driver, JVM and Python workers) when the sink reaches `<point>`
for batch N. Points: `crash-after-table-commit` (the table holds the batch, Spark's commit log does not),
`crash-before-table-commit`, `catalog-outage` (the commit attempt fails as if the catalog were unreachable),
`crash-mid-write` (an executor dies after writing its data files, before the
task reports), `fail-task` (a write task raises; with `local[N,F]` Spark retries it), `stall-task` (the
first attempt of a batch's first write task hangs until Spark kills it: a straggler, for the speculation
drill; Iceberg sink).
`once=<file>` fires only if the file does not exist yet and creates it, so a restarted app runs clean.

Drills must start the app in its own session (`start_new_session=True`) so the kill stays inside it.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from handoff_spark import switches

ENV = switches.FAULT.name


def _parse(spec: str) -> tuple[str, dict[str, str]]:
    point, _, rest = spec.partition(":")
    args = dict(kv.split("=", 1) for kv in rest.split(",") if "=" in kv)
    return point.strip(), args


def armed(point: str, batch_id: int | None = None) -> bool:
    """True if the fault `point` should fire now (consumes a `once` marker)."""
    spec = switches.FAULT()
    if not spec:
        return False
    for one in spec.split(";"):
        name, args = _parse(one)
        if name != point:
            continue
        if "batch" in args and batch_id is not None and int(args["batch"]) != batch_id:
            continue
        marker = args.get("once")
        if marker:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                os.close(fd)
            except FileExistsError:
                continue
        return True
    return False


def _app_process_group() -> int:
    """The app's process group. Spark's Python daemon moves its workers into a group of their own, so walk up
    the parents to the first process in another group (the JVM, in the app's group)."""
    mine = os.getpgrp()
    pid = os.getppid()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        fields = stat.rsplit(")", 1)[1].split()
        ppid, pgid = int(fields[1]), int(fields[2])
        if pgid != mine:
            return pgid
        pid = ppid
    return mine


def maybe_crash(point: str, batch_id: int | None) -> None:
    """SIGKILL the app's process group (and this worker's) if `point` is armed for this batch."""
    if armed(point, batch_id):
        log = switches.FAULT_LOG()
        if log:
            with open(log, "a") as fh:
                fh.write(f"{point} batch={batch_id}\n")
        target = _app_process_group()
        os.killpg(target, signal.SIGKILL)
        os.killpg(os.getpgrp(), signal.SIGKILL)


def maybe_stall(point: str, batch_id: int | None) -> None:
    """Hang this task attempt until Spark kills it if `point` is armed and this is the first attempt of the
    batch's first task: only a copy (speculation) or a retry on another attempt can finish the batch."""
    if not switches.FAULT():
        return  # every write task passes here: no fault set, nothing else to look at
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None or ctx.partitionId() != 0 or ctx.attemptNumber() != 0 or not armed(point, batch_id):
        return
    while True:
        time.sleep(1)


