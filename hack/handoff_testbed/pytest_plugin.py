"""Session-scoped pytest fixtures over the test-bed components (loaded from tests/conftest.py).

Each component is built (cached), started on free loopback ports for the session, and stopped at the
end even when tests fail. Its logs live under `.test-logs/<run>/<component>/` and are deleted after a
green session, kept after a red one (CI prints where).
"""
from __future__ import annotations

import os
import shutil
import time
from typing import Iterator

import pytest

from .base import Component
from .paths import REPO_ROOT
from .registry import component

# The pid keeps two sessions started in the same second (parallel engineers, CI shards) from sharing
# a root, where one's start_component/cleanup would delete the other's running components' files.
LOG_ROOT = REPO_ROOT / ".test-logs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"

# Test JVMs (Spark drivers of the drills, the Kafka broker) live for seconds to a minute on little data:
# C1-only JIT and the serial GC roughly halve a Spark session's start on 2 cores, which is most of a
# drill's time. Benchmarks and the demo do not get this: they measure steady-state throughput.
# HANDOFF_TEST_JAVA_OPTS="" turns it off.
os.environ.setdefault("JAVA_TOOL_OPTIONS",
                      os.environ.get("HANDOFF_TEST_JAVA_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"))


def start_component(name: str) -> Component:
    comp = component(name)
    comp.build()
    workdir = LOG_ROOT / name
    if workdir.exists():
        shutil.rmtree(workdir)
    comp.env = comp.start(workdir)  # type: ignore[attr-defined]
    return comp


def _session_fixture(name: str, fixture_name: str | None = None):
    @pytest.fixture(scope="session", name=fixture_name or name)
    def fixture() -> Iterator[Component]:
        comp = start_component(name)
        try:
            yield comp
        finally:
            comp.stop()

    return fixture


kafka = _session_fixture("kafka")
apiserver = _session_fixture("apiserver")
postgres = _session_fixture("postgres")
s3 = _session_fixture("s3")
gcs = _session_fixture("gcs")
bigquery = _session_fixture("bigquery")
schema_registry = _session_fixture("schema-registry", "schema_registry")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not LOG_ROOT.exists():
        return
    if exitstatus == 0 and not os.environ.get("HANDOFF_KEEP_LOGS"):
        shutil.rmtree(LOG_ROOT, ignore_errors=True)
    else:
        print(f"\ncomponent logs kept in {LOG_ROOT}")
