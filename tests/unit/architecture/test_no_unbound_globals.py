"""No function loads a global its module never binds: a NameError that only shows on the path that runs it (a
graceful stop once read a local of another function after a refactor, and only the SIGTERM drills found it).
Read from the compiled code (`LOAD_GLOBAL`/`LOAD_NAME`) against the names each module binds at its top level."""
from __future__ import annotations

import ast
import builtins
import dis
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ROOTS = ("operator", "spark_app", "tests", "hack", "bench")
IMPLICIT = {"__file__", "__name__", "__doc__", "__spec__", "__package__", "__builtins__", "__path__", "__loader__",
            "__annotations__"}


def _top_level(tree: ast.Module) -> list[ast.AST]:
    """The module's nodes outside any function, lambda or class body (their names are not the module's)."""
    out: list[ast.AST] = []
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        out.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))
    return out


def _bound(tree: ast.Module) -> set[str]:
    names = {g for node in ast.walk(tree) if isinstance(node, ast.Global) for g in node.names}
    for node in _top_level(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _unbound(path: Path) -> list[str]:
    source = path.read_text()
    tree = ast.parse(source)
    if any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in ast.walk(tree)):
        return []
    known = _bound(tree) | set(dir(builtins)) | IMPLICIT
    found: list[str] = []
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name

    def walk(code: types.CodeType) -> None:
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval not in known:
                found.append(f"{shown}:{ins.positions.lineno if ins.positions else '?'}: "
                             f"{ins.argval}")
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const)

    walk(compile(source, str(path), "exec"))
    return found


def _files() -> list[Path]:
    return sorted(p for root in ROOTS for p in (REPO / root).rglob("*.py")
                  if ".venv" not in p.parts and "results" not in p.parts)


def test_the_checker_finds_a_name_read_from_another_functions_locals(tmp_path: Path) -> None:
    bad = tmp_path / "example.py"
    bad.write_text("def run():\n    grace = 1\n    return grace\n\n\ndef wait():\n    return grace\n")
    assert _unbound(bad) == ["example.py:7: grace"]


@pytest.mark.parametrize("root", ROOTS)
def test_no_function_loads_a_global_its_module_never_binds(root: str) -> None:
    found = [line for path in _files() if path.is_relative_to(REPO / root) for line in _unbound(path)]
    assert found == []
