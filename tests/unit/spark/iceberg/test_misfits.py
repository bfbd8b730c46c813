"""misfits: the records that conflict on their own, found by halving (the rule, over plain data)."""
from __future__ import annotations

from collections.abc import Sequence

from handoff_spark.iceberg.misfits import misfits


def test_each_conflicting_row_is_found_alone_and_good_rows_are_not() -> None:
    bad = {3, 17, 18, 99}
    calls: list[int] = []

    def conflict(rows: Sequence[int]) -> str | None:
        calls.append(len(rows))
        hit = sorted(bad.intersection(rows))
        return f"rows {hit}" if hit else None

    assert misfits(range(100), conflict) == {3: "rows [3]", 17: "rows [17]", 18: "rows [18]", 99: "rows [99]"}
    assert len(calls) < 100  # halving, not one decode a row


def test_no_conflict_costs_one_look() -> None:
    calls: list[Sequence[int]] = []
    assert misfits(range(50), lambda rows: calls.append(rows)) == {}
    assert len(calls) == 1
