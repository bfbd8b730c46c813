"""Temporary directories a driver owns, named by its pid, so the next driver removes those a killed one left.

Why: a driver removes what it can when it stops, but one killed (kill -9, OOM) cannot, and a machine that restarts
drivers in place (`handoff run`, tests, a VM, a pod whose /tmp is a volume) kept one per kill: stop markers, the
local JVM's temporary directory, the warm-up queries' checkpoints, what libraries put in `tempfile`'s directory while
the driver starts its JVM."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether process `pid` exists (someone else's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def own_temp_dir(prefix: str) -> str:
    """A new `<tmp>/<prefix><pid>-<random>` directory for this process, after removing those of processes that are
    gone."""
    tmp = Path(tempfile.gettempdir())
    for old in tmp.glob(f"{prefix}*-*"):
        pid = old.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


@contextlib.contextmanager
def own_temp_dir_while(prefix: str) -> Iterator[str]:
    """`own_temp_dir`, removed again when the block ends (or by the next driver, if this one is killed in it)."""
    path = own_temp_dir(prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def tempfile_dir_while(prefix: str) -> Iterator[str]:
    """Python's `tempfile` makes its files and directories in an `own_temp_dir_while(prefix)` directory during the
    block (for every thread of the process), then where it did before.

    Why: libraries that make temporary files of their own remove them only if the process lives to do so. PySpark's
    JVM launch keeps its connection-info directory (`<tmp>/tmpXXXX`) until the JVM answers: a driver killed while
    its JVM started left one in /tmp for good. Inside this block it is in a directory named by the driver's pid."""
    with own_temp_dir_while(prefix) as path:
        previous = tempfile.tempdir
        tempfile.tempdir = path
        try:
            yield path
        finally:
            tempfile.tempdir = previous
