"""Every module imports on its own, whichever is imported first: no import circle (one made `app → progress →
sink_common → app` work only when `app` came first). Each module is imported first in a fresh interpreter
(in-process re-imports would trip over the process-wide Prometheus registry and kopf's handler registry)."""
from __future__ import annotations

import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import handoff_operator
import handoff_spark

MODULES = sorted(
    info.name
    for pkg in (handoff_spark, handoff_operator)
    for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{pkg.__name__}.", onerror=lambda _name: None)
    if not info.name.endswith("__main__"))


def _import_first(name: str) -> tuple[str, int, str]:
    run = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=120)
    return name, run.returncode, run.stderr[-2000:]


def test_every_module_imports_first():
    assert len(MODULES) > 30
    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = [(n, err) for n, rc, err in pool.map(_import_first, MODULES) if rc != 0]
    assert failed == []
