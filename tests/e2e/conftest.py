"""Fixtures of the drills: `cluster`, the test bed's API server with Handoff's CRDs (operator_support, shared with
tests/integration)."""
from __future__ import annotations

from operator_support import cluster  # noqa: F401 - a fixture, found here by pytest
