"""Fixtures shared by the operator's integration tests: `cluster` (operator_support, shared with tests/e2e)."""
from __future__ import annotations

from operator_support import cluster  # noqa: F401 - a fixture, found here by pytest
