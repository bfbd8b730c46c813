"""kopf's diff-base (the `last-handled-configuration` annotation) built without copying what it drops.

Why: kopf builds a handoff's "essence" for every watch event of it by deep-copying the whole body — status and
`metadata.managedFields` included — and then deleting everything but spec, labels and annotations. In a bulk
apply of 1,000 handoffs that copy was 13% of the operator's GIL samples (docs/benchmarks.md, operator scale, Round
5), on the event loop that also serves the watch indexes. Here kopf's own `build` runs on a body that already lacks
what it would drop, so the essence is the same (a unit test compares them) and the copy is of the spec only.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import kopf

#: What of `metadata` kopf's essence keeps.
KEPT_METADATA = ("labels", "annotations")


def slim_body(body: Mapping[str, Any], extra_fields: Iterable[Any] | None) -> Mapping[str, Any]:
    """`body` without status and without the metadata kopf's essence drops; `body` itself when a handler's field
    asks for something there (kopf then keeps that field too)."""
    if any(_dropped(path) for path in extra_fields or ()):
        return body
    meta = body.get("metadata") or {}
    slim = {k: v for k, v in body.items() if k not in ("metadata", "status")}
    slim["metadata"] = {k: meta[k] for k in KEPT_METADATA if k in meta}
    return slim


def _dropped(path: Any) -> bool:
    """Is a handler's field (kopf's FieldPath: a tuple of keys, or a dotted string) in what `slim_body` drops?"""
    parts = tuple(path.split(".")) if isinstance(path, str) else tuple(path)
    if not parts:
        return False
    return parts[0] == "status" or (parts[0] == "metadata" and (len(parts) < 2 or parts[1] not in KEPT_METADATA))


class SlimAnnotationsDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation storage of the diff-base, its essence built from `slim_body`."""

    def build(self, *, body: Any, extra_fields: Iterable[Any] | None = None) -> Any:
        slim = slim_body(body, extra_fields)
        return super().build(body=slim if slim is body else kopf.Body(slim), extra_fields=extra_fields)
