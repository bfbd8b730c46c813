"""The `e2e` marker and the `tests/e2e` folder say the same thing (issue 37): every module there marks all its tests
`e2e` (module-level `pytestmark`), and no test elsewhere carries the mark. So `-m "not e2e"` and "everything but
tests/e2e" select the same tests, and a long drill added to another tier is caught here rather than by the
suite's time."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def _module_marks(path: Path) -> set[str]:
    """The marker names in the module's `pytestmark = ...` (a mark or a list of them)."""
    marks: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark":
                    marks.add(sub.attr)
    return marks


def _marked_anywhere(path: Path) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "e2e" and isinstance(n.value, ast.Attribute)
               and n.value.attr == "mark" for n in ast.walk(ast.parse(path.read_text())))


def test_every_e2e_module_is_marked_and_no_other_test_is() -> None:
    e2e = sorted((TESTS / "e2e").glob("test_*.py"))
    assert e2e, "tests/e2e has drills"
    unmarked = [p.name for p in e2e if "e2e" not in _module_marks(p)]
    assert unmarked == [], f"add pytest.mark.e2e to the module's pytestmark: {unmarked}"
    elsewhere = [str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")
                 if "e2e" not in p.relative_to(TESTS).parts[:1] and "__pycache__" not in p.parts
                 and _marked_anywhere(p)]
    assert elsewhere == [], f"move these e2e-marked tests to tests/e2e, or drop the mark: {elsewhere}"
