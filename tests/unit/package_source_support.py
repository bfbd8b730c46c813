"""The two packages' sources as syntax trees, for the tests that check what the code spells or reads
(test_contract, test_switches): each module once, with its docstrings told apart (prose may name anything)."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import handoff_operator
import handoff_spark

SPARK = Path(handoff_spark.__file__).parent
OPERATOR = Path(handoff_operator.__file__).parent


@dataclass(frozen=True)
class Module:
    root: Path   # SPARK or OPERATOR
    path: Path
    tree: ast.Module
    docstrings: frozenset[int]  # id() of the docstring nodes

    def code_strings(self) -> Iterator[ast.Constant]:
        """String constants in code (not docstrings)."""
        return (n for n in ast.walk(self.tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and id(n) not in self.docstrings)


def modules(*skip: Path) -> Iterator[Module]:
    """Every module of both packages except `skip`."""
    for root in (SPARK, OPERATOR):
        for path in sorted(root.rglob("*.py")):
            if path in skip:
                continue
            tree = ast.parse(path.read_text(), str(path))
            docs = frozenset(id(node.body[0].value) for node in ast.walk(tree)
                             if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                             and node.body and isinstance(node.body[0], ast.Expr)
                             and isinstance(node.body[0].value, ast.Constant))
            yield Module(root, path, tree, docs)
