"""docs/where-things-are.md is the tree plus a sentence per folder: it names every folder and top-level module of
both packages, and nothing that is not there (a page that drifts from the tree sends a newcomer to the wrong room)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "where-things-are.md"
PACKAGES = {"handoff_spark": REPO / "spark_app" / "handoff_spark",
            "handoff_operator": REPO / "operator" / "handoff_operator"}
ENTRY = re.compile(r"^[├└]── (\S+)")


def _entries(package: str) -> set[str]:
    """The names listed under the `<package>/` tree of the page."""
    text = DOC.read_text()
    block = text.split(f"```\n{package}/\n", 1)[1].split("```", 1)[0]
    return {m.group(1) for line in block.splitlines() if (m := ENTRY.match(line))}


def _tree(root: Path) -> set[str]:
    """Folders (as `name/`) and top-level modules, as a newcomer sees them."""
    names = set()
    for path in root.iterdir():
        if path.is_dir() and (path / "__init__.py").exists():
            names.add(f"{path.name}/")
        elif path.suffix == ".py" and path.name != "__init__.py":
            names.add(path.name)
    return names


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_the_page_lists_exactly_the_tree(package: str) -> None:
    listed = _entries(package) - {"__init__.py"}
    assert listed == _tree(PACKAGES[package]), "update docs/where-things-are.md to the tree"


def test_the_around_it_paths_exist() -> None:
    block = DOC.read_text().split("## Around it", 1)[1]
    paths = re.findall(r"^(\S+/)", block, flags=re.M)
    assert paths and all((REPO / p).is_dir() for p in paths), paths
