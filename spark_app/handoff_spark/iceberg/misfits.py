"""The records of a batch whose values the table's existing columns cannot take, found by halving.

Why: under `schema.evolution=compatible` an undeclared field becomes a table column typed by the first batch that
carries it (say `note` long). A later record holding `"note": "hi"` makes its whole batch's `note` a string
column, which the table cannot take, and the batch used to stop the query on every restart: one record halting
the hand-off. Under `onIncompatible=deadLetter` that record is a dead letter instead, and the records beside it
are kept. A column-level conflict can only be told per record by decoding records apart (a batch's column type
is decided over all its records), so the batch is halved until each conflicting record stands alone:
O(k log n) decodes for k such records among n, and none at all for a batch without a conflict.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

#: decode(raw row indices) → why the table cannot take those records together, or None when it can.
Conflict = Callable[[Sequence[int]], "str | None"]


def misfits(rows: Sequence[int], conflict: Conflict) -> dict[int, str]:
    """{row: why} for each row that conflicts on its own, among `rows` that conflict together."""
    found: dict[int, str] = {}
    stack = [list(rows)]
    while stack:
        part = stack.pop()
        why = conflict(part)
        if why is None:
            continue
        if len(part) == 1:
            found[part[0]] = why
            continue
        half = len(part) // 2
        stack += [part[half:], part[:half]]
    return found
