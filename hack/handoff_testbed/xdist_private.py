"""The one place the test suite uses a private API of pytest-xdist (its fence): a scheduler that keeps the tests
of the real node on one worker.

Why not xdist's own `--dist loadgroup` with `xdist_group` markers: xdist 3.8 tags a grouped test by assigning
`item._nodeid`, which pytest 9 no longer reads (a node's id is `item._id`), so every test runs ungrouped and two
workers start two real nodes on one machine (one kubelet, bridge and iptables rule set per machine: they clash).
This subclass of `LoadScopeScheduling` overrides its `_split_scope` (private: xdist documents only
`pytest_xdist_make_scheduler`): the files that run the real node form one scope, which xdist runs on one worker
in collection order; every other test is a scope of its own, distributed like `--dist load`.
`tests/unit/testbed/test_xdist_scheduling.py` fails, naming the method, when an upgrade moves it."""
from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

#: Test files whose tests start the real node (marker `node`); the unit test checks the marker and this list agree.
NODE_TEST_FILES = ("tests/e2e/test_in_cluster.py", "tests/e2e/test_in_cluster_pod_options.py",
                   "tests/e2e/test_in_cluster_scaling.py", "tests/integration/testbed/test_testbed_node.py")
NODE_SCOPE = "the real node"


class NodeTestsTogether(LoadScopeScheduling):
    """Per-test distribution, except the real node's tests: one scope, one worker, one after another."""

    def _split_scope(self, nodeid: str) -> str:
        return NODE_SCOPE if nodeid.split("::", 1)[0] in NODE_TEST_FILES else nodeid
