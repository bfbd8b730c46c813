"""Zip archives on a Python path from which nothing can be imported, and so that only cost time: Spark's core jar.

Why: Spark puts its `spark-core` jar on the path of every Python process it starts (`PYTHONPATH`, for a pyspark
packaged inside it, which a pip install never is). Python's zipimport reads an archive's whole directory (here
~6,000 entries, ~40 ms) the first time a process looks an import up past it, and again at every
`importlib.invalidate_caches()` (Python 3.11), which PySpark runs as each worker or runner sets up Spark's files
(`setup_spark_files`). Traced in a fork of the driver's fork server (the streaming source runner of each query):
two reads, ~85 ms of its ~150 ms start. Taken off the path, nothing that can be imported changes.

Used by the fork server (`fork_server.child_path`, for every process it forks: the runners and the daemons whose
workers the planners and commits run in) and the worker daemon (`worker_daemon.drop_archives_without_python`, on
an executor pod, which has no fork server).
"""
from __future__ import annotations

import os
import stat
import zipfile
from collections.abc import Iterable

#: (path, size, mtime) → whether the archive holds a Python module; the fork server fills it before it forks, so
#: its forks read no archive themselves.
_HOLDS_PYTHON: dict[tuple[str, int, int], bool] = {}


def holds_python(entry: str) -> bool:
    """Whether `entry` may provide an import: anything but a readable zip archive (`.jar`, `.zip`) without a `.py`
    or `.pyc` file in it (zipimport imports nothing else)."""
    if not entry.endswith((".jar", ".zip")):
        return True
    try:
        st = os.stat(entry)
    except OSError:
        return True  # missing: Python's own finder skips it as cheaply
    if not stat.S_ISREG(st.st_mode):
        return True
    key = (entry, st.st_size, st.st_mtime_ns)
    if key not in _HOLDS_PYTHON:
        try:
            with zipfile.ZipFile(entry) as archive:
                _HOLDS_PYTHON[key] = any(name.endswith((".py", ".pyc")) for name in archive.namelist())
        except (OSError, zipfile.BadZipFile):
            _HOLDS_PYTHON[key] = True  # not ours to judge: left as it is
    return _HOLDS_PYTHON[key]


def without_python(entries: Iterable[str]) -> list[str]:
    """The entries that are archives holding no Python module, each once, in order."""
    return [e for e in dict.fromkeys(entries) if e and not holds_python(e)]
