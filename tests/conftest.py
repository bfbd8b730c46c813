"""Test-bed fixtures (kafka, apiserver, postgres, s3, bigquery) come from hack/handoff_testbed.

`make test` runs the suite on two pytest-xdist workers: each worker starts its own test-bed components on free
loopback ports, and the tests that run the real node (marker `node`: one kubelet, its bridge and iptables rules
per machine) all go to one worker, one after another (handoff_testbed.xdist_private)."""
from __future__ import annotations

from typing import Any

import pytest

pytest_plugins = ["handoff_testbed.pytest_plugin"]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from handoff_testbed.xdist_private import NodeTestsTogether

    return NodeTestsTogether(config, log)
