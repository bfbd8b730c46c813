"""The driver's Kubernetes threads (progress publisher, query hold, executor scaler) find the Kubernetes client
imported before they start. A first import of `requests` in one of them raced the main thread's import of
google-cloud-bigquery and crashed a driver at its start ("partially initialized module 'requests.utils'")."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]

# Records, at every Thread.start in a fresh interpreter, whether the client (and requests under it) was loaded.
_PROBE = textwrap.dedent("""
    import sys, threading
    seen = []
    _start = threading.Thread.start
    def start(self):
        seen.append((self.name, all(m in sys.modules for m in ("kubernetes.client", "kubernetes.config", "requests"))))
        _start(self)
    threading.Thread.start = start
    {body}
    print(seen)
    assert seen and all(loaded for _, loaded in seen), seen
""")

_BODIES = {
    "publisher": """
from handoff_spark.driver.publisher import ProgressPublisher
ProgressPublisher("ns", "orders-progress", api=object()).close()
""",
    "hold": """
from handoff_spark.driver.hold import QueryHold
QueryHold("ns", "orders-progress", poll=60, api=object()).start().close()
""",
    "scaler": """
from handoff_spark.driver.executor_scaler import ExecutorScaler
ExecutorScaler("ns", "orders-progress", None, min_partitions_file="/nonexistent", partitions_per_core=2,
               poll=60, api=object()).start()
""",
}


def _probe(name: str) -> subprocess.CompletedProcess[str]:
    code = _PROBE.format(body=_BODIES[name])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO / "spark_app"), "PATH": "/usr/bin:/bin"})


def test_each_kubernetes_thread_starts_with_the_client_already_imported() -> None:
    for name in _BODIES:
        done = _probe(name)
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr[-2000:]}"
        assert "handoff-" in done.stdout, f"{name}: no thread started: {done.stdout}"
