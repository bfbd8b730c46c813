"""No import circle inside `handoff_spark`, read from the source (AST), not from what happens to import first.

`test_import_order` catches a circle that breaks an import; this one catches the ones that do not break yet:
an import inside a function counts (it runs on some path, and it ties the two modules together just the
same), an import under `if TYPE_CHECKING:` does not (it never runs). Two such circles were here
(`bigquery.ledger` ↔ `bigquery.sink` over `add_columns`, `iceberg.sink` ↔ `iceberg.stream`); each was broken by
putting the shared piece where both can import it (`bigquery.table`; the registry takes the data source from
`iceberg.stream`).
"""
from __future__ import annotations

import ast
from pathlib import Path

import handoff_spark

ROOT = Path(handoff_spark.__file__).parent
PACKAGE = "handoff_spark"


def module_names() -> dict[str, Path]:
    names = {}
    for path in ROOT.rglob("*.py"):
        parts = (PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules `module` imports anywhere in its body (functions included), `TYPE_CHECKING`
    blocks left out; `from package import name` counts as importing `package.name` when that is a module."""
    targets: list[str] = []

    def walk(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                walk(child)
            return
        if isinstance(node, ast.Import):
            targets.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([*here, base] if base else here)
            targets.extend(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(ast.parse(path.read_text(), str(path)))
    found = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != module:
            found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def import_graph() -> dict[str, set[str]]:
    names = module_names()
    return {m: imported(m, p, set(names)) for m, p in names.items()}


def test_the_graph_sees_lazy_imports_and_skips_type_checking_ones():
    graph = import_graph()
    assert "handoff_spark.iceberg.sink" in graph["handoff_spark.iceberg.stream"]  # inside the writer's methods
    assert "handoff_spark.config" not in graph["handoff_spark.kafka.source"]  # under TYPE_CHECKING only


def test_no_import_circle_in_the_data_plane():
    assert cycles(import_graph()) == []
