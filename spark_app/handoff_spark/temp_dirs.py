"""Temporary directories a driver owns, named by its pid, so the next driver removes those a killed one left.

Why: a driver removes what it can when it stops, but one killed (kill -9, OOM) cannot, and a machine that restarts
drivers in place (`handoff run`, tests, a VM, a pod whose /tmp is a volume) kept one per kill: stop markers, the
local JVM's temporary directory, the warm-up queries' checkpoints."""
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
