"""What the private-API fences share: `pyspark_private`, `confluent_kafka_private`, `iceberg.pyiceberg_private`.

Why fences: Handoff uses a few private APIs of its libraries where no public one does the job (each fence says
why, name by name). A library may move or drop a private name in any release, without a deprecation. Each
library's private names are used through its one fence module only, so an upgrade is checked in one file, and
tests/unit/spark/test_private_api_fences.py resolves every name a fence lists against the installed version: an
upgrade that moves one fails that test with the name, not a batch in production with an AttributeError. Names
that only exist on live objects (set in `__init__`) are read through `attribute`, which fails the same way.
"""
from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterable
from typing import Any


class PrivateApiMissing(RuntimeError):
    """A private API a fence uses is not in the installed library (an upgrade moved or dropped it)."""

    def __init__(self, api: str, fence: str) -> None:
        library = api.split(".", 1)[0]
        super().__init__(f"{api} is gone in the installed {library} {_version(library)}: Handoff uses this private "
                         f"API through {fence}; install the version requirements.lock pins, or port {fence} to "
                         f"this version")
        self.api = api


def _version(module: str) -> str:
    try:
        dists = importlib.metadata.packages_distributions().get(module) or [module]
        return importlib.metadata.version(dists[0])
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def attribute(obj: Any, name: str, *, api: str, fence: str) -> Any:
    """`obj.name`, or `PrivateApiMissing(api)` when the installed library no longer has it."""
    try:
        return getattr(obj, name)
    except AttributeError:
        raise PrivateApiMissing(api, fence) from None


def resolve(api: str) -> Any:
    """The object a dotted name (`package.module.Class.attr`) names: the longest importable module prefix, then
    attributes. Raises ImportError or AttributeError when it does not resolve."""
    parts = api.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            if cut == 1:
                raise
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(api)  # unreachable: the loop returns or raises


def unresolved(apis: Iterable[str]) -> list[str]:
    """Those of `apis` (dotted names) the installed libraries no longer have."""
    missing = []
    for api in apis:
        try:
            resolve(api)
        except (ImportError, AttributeError):
            missing.append(api)
    return missing
