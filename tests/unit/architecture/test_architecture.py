"""The architecture of both packages, read from their source (AST), so that it stays what the tree says:

(a) no import circle between modules;
(b) no module imports a private name (`_x`) of another;
(c) the operator (`handoff_operator.*`, the kubectl plugin included) imports the data plane only through its public
    face (`PUBLIC_FACE`), and that face imports no pyspark when it is imported;
(d) every package folder's `__init__` has a docstring, and its `May import:` line names every module outside the
    folder that the folder's modules import.

What counts as an import: every `import` / `from … import` anywhere in a module, inside functions too (a lazy import
runs on some path, and it ties the two modules together just the same), except under `if TYPE_CHECKING:` (it never
runs). `from package import name` imports the module `package.name` when there is one, else `package`; an import is
of its module only, not of the packages above it.

The `May import:` line lists modules or folders, comma-separated, ending at the sentence's end; names are relative
to the folder's own package (`config`, `driver.temp_dirs`) or whole for the other package (`handoff_spark.config`);
text in parentheses is commentary. A folder may import what it names and anything inside it; what it names must
exist.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGES = {"handoff_spark": REPO / "spark_app" / "handoff_spark",
            "handoff_operator": REPO / "operator" / "handoff_operator"}

#: The data plane's public face: the only `handoff_spark` modules the operator imports. Everything else of the data
#: plane (the sinks, the Kafka source, the driver) may change its modules without the operator noticing.
PUBLIC_FACE: dict[str, str] = {
    # The app config the operator renders for the driver, and the column-type grammar the CRD's models validate
    # with (re-exported there, so the CRD can never drift from the decoder).
    "handoff_spark.config": "the app config and the column-type grammar",
    # The ledger's record and rules, lag, and a handoff's ledger read from either backend's table, and the consumer
    # group's offsets: each backend imported when called, never pyspark.
    "handoff_spark.ledger": "the ledger, lag, and reading it from each backend",
    # The operator ↔ driver wire names and shapes (annotations, the published progress record), one definition
    # imported by both sides.
    "handoff_spark.contract": "the operator ↔ driver wire contract",
    # The environment switches, parsed one way, for those the operator renders into the driver's pods.
    "handoff_spark.switches": "the environment switches",
    # The data plane's error types, reported to a person as they are.
    "handoff_spark.errors": "the data plane's errors",
    # What the `handoff` command runs of the data plane in its own process: `handoff run`'s temp dir, `handoff
    # ledger show / accept-kafka` (`handoff run` then execs `python -m handoff_spark`).
    "handoff_spark.entry": "the `handoff` command's entry points",
}

#: Libraries the public face must not import when it is imported (the operator's image has no Spark).
NOT_IN_THE_OPERATOR = ("pyspark", "py4j")


# ------------------------------------------------------------------------------------------------ reading

@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    #: (target module, imported name or None for `import x`, line, inside a function)
    imports: list[tuple[str, str | None, int, bool]] = field(default_factory=list)
    #: (imported module bound to a local name, attribute read on it, line)
    attributes: list[tuple[str, str, int]] = field(default_factory=list)


def _module_files() -> dict[str, tuple[Path, bool]]:
    """Every module of both packages: .py files, and C extensions (by their .c source or built library)."""
    found: dict[str, tuple[Path, bool]] = {}
    for package, root in PACKAGES.items():
        for path in sorted(root.rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            rel = path.relative_to(root)
            if path.suffix == ".py":
                parts = (package, *rel.with_suffix("").parts)
                is_package = parts[-1] == "__init__"
                found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
            elif path.suffix in (".c", ".so"):
                parts = (package, *rel.parent.parts, path.name.split(".")[0])
                found.setdefault(".".join(parts), (path, False))
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(target: str, known: set[str]) -> str:
    """The module `target` names: itself, or the nearest enclosing module (`import a.b.attr` is odd but legal)."""
    while target and target not in known and "." in target:
        target = target.rpartition(".")[0]
    return target


def _read(name: str, path: Path, is_package: bool, known: set[str]) -> Module:
    module = Module(name, path, is_package)
    if path.suffix != ".py":
        return module
    bound: dict[str, str] = {}  # local name → the module it is bound to (for `module._private` reads)

    def base_of(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        here = name.split(".") if is_package else name.split(".")[:-1]
        here = here[: len(here) - (node.level - 1)]
        return ".".join([*here, node.module] if node.module else here)

    def walk(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                walk(child, in_function)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, known) if alias.name.split(".")[0] in PACKAGES else alias.name
                module.imports.append((target, None, node.lineno, in_function))
                if alias.asname:
                    bound[alias.asname] = target
                else:
                    bound.setdefault(alias.name.split(".")[0], alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            base = base_of(node)
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                if whole in known:
                    module.imports.append((whole, None, node.lineno, in_function))
                    bound[alias.asname or alias.name] = whole
                else:
                    target = _resolve(base, known) if base.split(".")[0] in PACKAGES else base
                    module.imports.append((target, alias.name, node.lineno, in_function))
        elif isinstance(node, ast.Attribute):
            chain: list[str] = []
            inner: ast.expr = node
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in bound:
                owner = bound[inner.id]
                for attr in reversed(chain):  # walk down while the attributes name modules
                    if f"{owner}.{attr}" in known and not attr.startswith("_"):
                        owner = f"{owner}.{attr}"
                        continue
                    module.attributes.append((owner, attr, node.lineno))
                    break
                return  # the chain is read; its inner attributes are not separate reads
        nested = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            walk(child, nested)

    walk(ast.parse(path.read_text(), str(path)), False)
    return module


_MODULES: dict[str, Module] | None = None


def modules() -> dict[str, Module]:
    global _MODULES
    if _MODULES is None:
        files = _module_files()
        known = set(files)
        _MODULES = {name: _read(name, path, is_package, known) for name, (path, is_package) in files.items()}
    return _MODULES


def ours(target: str) -> bool:
    return target.split(".")[0] in PACKAGES


def import_graph() -> dict[str, set[str]]:
    """module → the modules of both packages it imports (itself left out)."""
    mods = modules()
    return {name: {t for t, _n, _l, _f in m.imports if t in mods and t != name} for name, m in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every module of one
    imports, through the others, every other (and itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
    return sorted(found)


def _circle(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One path from the component's first module back to it (for the failure message)."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    return component


# ------------------------------------------------------------------------------------------------ (a)

def test_the_reading_sees_lazy_imports_and_skips_type_checking_ones(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\n"
                   "from handoff_spark import ledger\n"
                   "from handoff_spark.ledger import Commit\n"
                   "if TYPE_CHECKING:\n    from handoff_spark.config import AppConfig\n"
                   "def f():\n    import handoff_spark.iceberg.ledger.attribute\n")
    m = _read("handoff_operator.m", src, False, set(modules()))
    assert [(t, n, f) for t, n, _l, f in m.imports if ours(t)] == [
        ("handoff_spark.ledger", None, False),            # `from package import module`: the module
        ("handoff_spark.ledger", "Commit", False),        # `from module import name`: the module
        ("handoff_spark.iceberg.ledger", None, True)]     # inside a function: counted, as lazy
    assert "handoff_spark.bigquery.ledger" in import_graph()["handoff_spark.ledger.backends"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle():
    graph = import_graph()
    circles = [" → ".join(_circle(c, graph)) for c in cycles(graph)]
    assert circles == [], "import circles (break each by moving what both sides need where both can import it):\n" + \
        "\n".join(circles)


# ------------------------------------------------------------------------------------------------ (b)

def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _may_see(importer: str, owner: str) -> bool:
    """A private module (`decode._json_arrow`, a C tier) is its package's own: the package's modules may import it."""
    return importer == owner or importer.startswith(owner + ".")


def private_imports() -> list[str]:
    mods = modules()
    found = []
    for name, m in sorted(mods.items()):
        for target, imported, line, _f in m.imports:
            if not ours(target):
                continue
            # a private module on the way (`import handoff_spark.decode._json_arrow`, `from x._y import z`)
            parts = target.split(".")
            for i, part in enumerate(parts):
                if _private(part) and not _may_see(name, ".".join(parts[:i])):
                    found.append(f"{name}:{line} imports {target}")
                    break
            if imported is not None and _private(imported):
                found.append(f"{name}:{line} imports {imported} from {target}")
        for owner, attr, line in m.attributes:
            if _private(attr) and ours(owner) and owner != name:
                if f"{owner}.{attr}" in mods and _may_see(name, owner):
                    continue
                found.append(f"{name}:{line} reads {owner}.{attr}")
    return found


def test_the_private_name_check_sees_both_forms(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from handoff_spark.kafka import source\n"
                   "from handoff_spark.decode.records import _x\n"
                   "def f():\n    return source._Hidden, source.Public\n")
    m = _read("handoff_operator.m", src, False, set(modules()))
    assert ("handoff_spark.decode.records", "_x", 2, False) in m.imports
    assert m.attributes == [("handoff_spark.kafka.source", "_Hidden", 4), ("handoff_spark.kafka.source", "Public", 4)]


def test_no_module_imports_a_private_name_of_another():
    """Libraries' private APIs are another matter: each sits behind its fence module (`pyspark_private`,
    `kafka.confluent_kafka_private`, `iceberg.pyiceberg_private`; tests/unit/spark/test_private_api_fences.py)."""
    found = private_imports()
    assert found == [], "private names used from another module (make them public, or move the code):\n" + \
        "\n".join(found)


# ------------------------------------------------------------------------------------------------ (c)

def test_the_operator_reaches_the_data_plane_only_through_its_public_face():
    found = sorted({f"{name}:{line} imports {target}"
                    for name, m in modules().items() if name.startswith("handoff_operator")
                    for target, _n, line, _f in m.imports
                    if target.split(".")[0] == "handoff_spark" and target not in PUBLIC_FACE})
    assert found == [], ("the operator imports data-plane internals; go through the public face "
                         f"({', '.join(sorted(PUBLIC_FACE))}) or widen it on purpose:\n" + "\n".join(found))


def _imported_on_import(start: str) -> Iterator[tuple[str, str]]:
    """(module, what it imports at module level) for `start` and every module of ours that importing it imports."""
    mods = modules()
    seen = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in mods:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(2, len(parts))]  # its packages' __init__s run first
        for target, _n, _l, in_function in mods[name].imports:
            if in_function:
                continue
            yield name, target
            if ours(target):
                todo.append(target)


def test_the_public_face_imports_no_spark():
    found = sorted({f"importing {face}: {name} imports {target}"
                    for face in PUBLIC_FACE if face in modules()
                    for name, target in _imported_on_import(face)
                    if target.split(".")[0] in NOT_IN_THE_OPERATOR})
    assert found == []


# ------------------------------------------------------------------------------------------------ (d)

def package_folders() -> list[str]:
    return sorted(name for name, m in modules().items() if m.is_package)


def docstring(name: str) -> str | None:
    return ast.get_docstring(ast.parse(modules()[name].path.read_text()))


MAY_IMPORT = re.compile(r"May import:(.*)", re.DOTALL)


def may_import(folder: str, text: str) -> list[str] | None:
    """The names of the folder's `May import:` line, whole (None: no such line)."""
    found = MAY_IMPORT.search(text)
    if found is None:
        return None
    rest = re.sub(r"\([^)]*\)", "", found.group(1))
    rest = re.split(r"\.(?:\s|$)", rest, maxsplit=1)[0]
    package = folder.split(".")[0]
    names = []
    for item in re.split(r",|\band\b", rest.replace("`", "")):
        item = item.strip()
        if not item or item == "nothing":
            continue
        names.append(item if ours(item) else f"{package}.{item}")
    return names


def test_the_may_import_line_reads_names_parentheses_and_the_sentence_end():
    text = "Stuff.\n\nMay import: `config`, `handoff_spark.ledger` (its face. Only)\nand `driver.temp_dirs`. Imported by x."
    assert may_import("handoff_operator.truth", text) == ["handoff_operator.config", "handoff_spark.ledger",
                                                          "handoff_operator.driver.temp_dirs"]
    assert may_import("handoff_spark.iceberg", "May import: nothing.") == []


def folder_imports(folder: str) -> dict[str, list[str]]:
    """target outside the folder → where the folder's modules import it."""
    out: dict[str, list[str]] = {}
    for name, m in modules().items():
        if name != folder and not name.startswith(folder + "."):
            continue
        for target, _n, line, _f in m.imports:
            if ours(target) and target != folder and not target.startswith(folder + "."):
                out.setdefault(target, []).append(f"{name}:{line}")
    return out


@pytest.mark.parametrize("folder", package_folders())
def test_each_folder_says_what_lives_there_and_what_it_may_import(folder):
    text = docstring(folder)
    assert text and len(text.split()) >= 8, f"{folder}/__init__.py: say in its docstring what lives there"
    if folder in PACKAGES:
        return  # the package itself: everything lives there
    allowed = may_import(folder, text)
    assert allowed is not None, f"{folder}/__init__.py: its docstring needs a `May import: …` line"
    unknown = [a for a in allowed if a not in modules()]
    assert unknown == [], f"{folder}: `May import:` names what does not exist: {unknown}"
    undeclared = {target: where for target, where in sorted(folder_imports(folder).items())
                  if not any(target == a or target.startswith(a + ".") for a in allowed)}
    assert undeclared == {}, f"{folder} imports what its `May import:` line does not name: {undeclared}"
