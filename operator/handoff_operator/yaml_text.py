"""YAML that Go reads back as the strings it was given.

PyYAML resolves plain scalars by YAML 1.1 as PyYAML reads it, so it writes `57280e00`, `1e5`, `0o17`, `y` and `n`
without quotes: to PyYAML they are strings. kubectl, Helm and the API server read YAML with go-yaml
(sigs.k8s.io/yaml), which takes those as a float, an int and booleans. A random toleration value `57280e00`
became the number 57280 and the API server refused the Deployment. The dumper here knows Go's extra forms, so
PyYAML's own quoting decision (a plain scalar that would resolve to another type is quoted) covers them.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import yaml


class GoSafeDumper(yaml.SafeDumper):
    """`yaml.SafeDumper` that also quotes the plain scalars go-yaml reads as numbers or booleans."""


# go-yaml's float form (no dot needed before an exponent), its ints (strconv base prefixes 0x, 0o, 0b and
# underscores) and its one-letter booleans.
GoSafeDumper.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\.[0-9_]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?$"),
    list("-+0123456789."))
GoSafeDumper.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?0[oO][0-7_]+$|^[-+]?0[xX][0-9a-fA-F_]+$|^[-+]?0[bB][01_]+$"),
    list("-+0"))
GoSafeDumper.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))


def dump(doc: Any, **options: Any) -> str:
    """One document (`yaml.safe_dump`'s options)."""
    return yaml.dump(doc, Dumper=GoSafeDumper, **options)


def dump_all(docs: Iterable[Any], **options: Any) -> str:
    """A `---`-separated stream of documents."""
    return yaml.dump_all(docs, Dumper=GoSafeDumper, **options)
