"""The test-bed node refuses to start on a nearly full disk, naming the file system, the space and what to free,
instead of a kubelet that admits no pod and garbage-collects its images (handoff_testbed.node.disk_shortfall)."""
from __future__ import annotations

from handoff_testbed.node import EVICTION_FREE_FRACTION, NODE_WORKING_SPACE, disk_shortfall

GIB = 1024**3


def test_enough_room_above_the_eviction_threshold_passes() -> None:
    total = 250 * GIB
    assert disk_shortfall("/w", int(total * EVICTION_FREE_FRACTION) + NODE_WORKING_SPACE, total) is None
    assert disk_shortfall("/w", 50 * GIB, total) is None


def test_a_nearly_full_disk_is_refused_with_the_numbers_and_the_fix() -> None:
    problem = disk_shortfall("/tmp/clone/.test-logs/run/node", int(0.36 * GIB), 252 * GIB)
    assert problem is not None
    assert "/tmp/clone/.test-logs/run/node" in problem and "0.4 GiB free" in problem
    assert "4.5 GiB free" in problem  # 1 % of 252 GiB plus the tests' 2 GiB
    assert "uv cache prune" in problem and "\n" not in problem


def test_just_below_the_need_is_refused() -> None:
    total = 100 * GIB
    need = int(total * EVICTION_FREE_FRACTION) + NODE_WORKING_SPACE
    assert disk_shortfall("/w", need - 1, total) is not None


def test_the_nodes_start_check_passes_on_this_machines_disk_or_names_it(tmp_path) -> None:
    """`check_disk` as the node's start runs it, on the real file systems of a work directory and the cache."""
    import shutil

    import pytest

    from handoff_testbed.node import check_disk
    from handoff_testbed.proc import StartupError

    usage = shutil.disk_usage(tmp_path)
    if disk_shortfall(str(tmp_path), usage.free, usage.total) is None:
        check_disk(tmp_path)
    else:
        with pytest.raises(StartupError, match="GiB free"):
            check_disk(tmp_path)
