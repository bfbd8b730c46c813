"""Test bed of real components (Kafka, kube-apiserver, PostgreSQL, S3, BigQuery emulator).

One implementation serves both `hack/testbed up|down` (a developer's shell) and the pytest fixtures
in `tests/conftest.py`, so what the tests run against is exactly what a developer can start by hand.
Everything binds to free loopback ports and is cached under the user's cache dir (see `paths`).
"""
from __future__ import annotations

from .toolchains import activate

# The test bed's kubectl first on PATH, for this process and every process it starts: the demo, `hack/testbed`
# and the pytest plugin all import this package first.
activate()
