"""Test-bed fixtures (kafka, apiserver, postgres, s3, bigquery) come from hack/handoff_testbed.

`make test` runs the suite on two pytest-xdist workers (`--dist loadgroup`): each worker starts its own test-bed
components on free loopback ports, and the tests that run the real node (marker `node`: one kubelet, its bridge
and iptables rules per machine) all go to one worker, one after another."""
from __future__ import annotations

import pytest

pytest_plugins = ["handoff_testbed.pytest_plugin"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("node") is not None:
            item.add_marker(pytest.mark.xdist_group("node"))
