"""Fault injection for the exactly-once drills — a documented test hook, inert unless `HANDOFF_FAULT` is set.

`HANDOFF_FAULT=<point>:batch=<N>[,once=<marker file>]` makes the process group die with SIGKILL (the
equivalent of `kill -9` on the whole app: driver, JVM and Python workers) when the sink reaches `<point>`
for batch N. Points: `crash-after-table-commit` (the table holds the batch, Spark's commit log does not),
`crash-before-table-commit`, `fail-task` (one write task raises; with `local[N,F]` Spark retries it).
`once=<file>` fires only if the file does not exist yet and creates it, so a restarted app runs clean.

Drills must start the app in its own session (`start_new_session=True`) so the kill stays inside it.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

ENV = "HANDOFF_FAULT"


def _parse(spec: str) -> tuple[str, dict[str, str]]:
    point, _, rest = spec.partition(":")
    args = dict(kv.split("=", 1) for kv in rest.split(",") if "=" in kv)
    return point.strip(), args


def armed(point: str, batch_id: int | None = None) -> bool:
    """True if the fault `point` should fire now (consumes a `once` marker)."""
    spec = os.environ.get(ENV)
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


def maybe_crash(point: str, batch_id: int) -> None:
    """SIGKILL the whole process group if `point` is armed for this batch."""
    if armed(point, batch_id):
        Path(os.environ.get("HANDOFF_FAULT_LOG", os.devnull)).open("a").write(f"{point} batch={batch_id}\n")
        os.killpg(os.getpgrp(), signal.SIGKILL)
