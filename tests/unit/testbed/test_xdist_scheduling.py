"""The suite's xdist scheduler: the real node's tests stay together; the list of their files matches the marker."""
from __future__ import annotations

import ast
from pathlib import Path

from handoff_testbed import xdist_private
from handoff_testbed.xdist_private import NODE_SCOPE, NODE_TEST_FILES, NodeTestsTogether

REPO = Path(__file__).resolve().parents[3]


def test_the_private_method_it_overrides_still_exists() -> None:
    base = NodeTestsTogether.__mro__[1]
    assert callable(getattr(base, "_split_scope", None)), (
        f"pytest-xdist's {base.__name__}._split_scope is gone: {xdist_private.__file__} overrides it to keep the "
        f"real node's tests on one worker; port it to the new xdist")


def test_node_tests_share_one_scope_and_the_rest_are_their_own() -> None:
    split = NodeTestsTogether._split_scope
    assert {split(None, f"{path}::test_x") for path in NODE_TEST_FILES} == {NODE_SCOPE}  # type: ignore[arg-type]
    assert split(None, "tests/e2e/test_iceberg_drills.py::test_a") == "tests/e2e/test_iceberg_drills.py::test_a"  # type: ignore[arg-type]


def test_the_files_with_the_node_marker_are_the_listed_ones() -> None:
    """A new test of the real node outside the list would run beside another node on the second worker."""
    marked = set()
    for path in (REPO / "tests").rglob("test_*.py"):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.Attribute) and n.attr == "node" and isinstance(n.value, ast.Attribute)
               and n.value.attr == "mark" for n in ast.walk(tree)):
            marked.add(str(path.relative_to(REPO)))
    assert marked == set(NODE_TEST_FILES)
