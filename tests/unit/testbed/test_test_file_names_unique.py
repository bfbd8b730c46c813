"""The suite is collected in rootdir mode without `__init__.py` files (pyproject's `pythonpath`), so pytest imports
each test file under its bare basename: two files with one name in different folders make the second an
"import file mismatch" error, which surfaced only 45 minutes into a CI run. This check finds it in the unit tier."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def test_no_two_test_files_share_a_basename() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in by_name.items() if len(paths) > 1 and name != "conftest.py"}
    assert clashes == {}, f"rename one of each (pytest imports test modules by basename): {clashes}"
