"""The timeline's merge (pure): every source's rows, newest first, cut by --since and --limit."""
from __future__ import annotations

from handoff_operator.kubectl_plugin import timeline


def entry(snapshot: int, batch: int, ts: int, kind: str = "batch", reason: str | None = None) -> dict:
    return {"kind": kind, "snapshot": snapshot, "query": "handoff", "batch": batch, "timestampMs": ts, "rows": 5,
            "deadLetters": 1, "offsets": {"t": {"0": [batch * 5, batch * 5 + 5]}}, "reason": reason}


EVENTS = [{"type": "Warning", "reason": "DriverFailing", "message": "boom", "count": 3,
           "lastTimestamp": "1970-01-01T00:00:02Z"},
          {"type": "Normal", "reason": "Scaled", "message": "2 → 3 executors", "eventTime": "1970-01-01T00:00:04.500000Z"}]
REQUESTS = [{"metadata": {"name": "r1", "creationTimestamp": "1970-01-01T00:00:05Z"},
             "spec": {"handoffRef": {"name": "orders"}, "mode": "RollbackAndReplay", "target": {"snapshotId": "11"}},
             "status": {"phase": "Succeeded", "steps": [{"name": "RolledBack", "at": "1970-01-01T00:00:06Z",
                                                         "message": "to 11"}],
                        "completedAt": "1970-01-01T00:00:07Z"}},
            {"metadata": {"name": "other", "creationTimestamp": "1970-01-01T00:00:08Z"},
             "spec": {"handoffRef": {"name": "payments"}, "mode": "Rollback", "target": {"tag": "x"}}}]


def test_sources_merge_newest_first_and_only_this_handoffs_replays():
    rows = timeline.rows([entry(11, 0, 1000), entry(12, 1, 3000), entry(13, 2, 3500, kind="gap", reason="lost")],
                         EVENTS, REQUESTS, "orders")
    assert [(r["source"], r["kind"]) for r in rows] == [
        ("replay", "Succeeded"), ("replay", "RolledBack"), ("replay", "ReplayRequested"), ("event", "Scaled"),
        ("ledger", "gap"), ("ledger", "batch"), ("event", "DriverFailing"), ("ledger", "batch")]
    assert rows[-1]["snapshot"] == 11 and rows[-1]["what"] == "batch 0 (handoff): 5 rows, 1 dead letters; t[0] 0→5"
    assert rows[4]["what"] == "gap (handoff): t[0] 10→15 — lost"
    assert rows[6]["what"] == "Warning DriverFailing: boom (×3)"
    assert rows[2]["what"] == "ReplayRequest r1: RollbackAndReplay to 11"
    assert rows[0]["time"] == "1970-01-01T00:00:07.000000Z"


def test_since_and_limit_cut_the_list():
    rows = timeline.rows([entry(11, 0, 1000), entry(12, 1, 3000)], EVENTS, REQUESTS, "orders", since_ms=3000,
                         limit=3)
    assert [r["timeMs"] for r in rows] == [7000, 6000, 5000]
    assert timeline.parse_since("2h", 10_000_000) == 10_000_000 - 7_200_000
    assert timeline.format_text([]) == "(nothing in this window)"
    text = timeline.format_text(timeline.rows([entry(11, 0, 1000)], [], [], "orders"))
    assert text.startswith("1970-01-01T00:00:01.000Z  ledger  batch 0") and text.endswith("[snapshot 11]")


def test_the_operators_record_is_merged_and_an_event_it_holds_is_shown_once():
    record = [{"timeMs": 4400, "type": "Normal", "reason": "Scaled", "message": "2 → 3 executors"},
              {"timeMs": 900, "type": "Normal", "reason": "SpecChanged", "message": "generation 2 of the spec (was 1)"}]
    rows = timeline.rows([], EVENTS, [], "orders", record=record)
    assert [(r["source"], r["kind"]) for r in rows] == [
        ("operator", "Scaled"), ("event", "DriverFailing"), ("operator", "SpecChanged")]
    # The same reason and message long apart are two happenings.
    later = [{**record[0], "timeMs": 4400 + timeline.SAME_HAPPENING_MS + 200}]
    assert [r["source"] for r in timeline.rows([], EVENTS, [], "orders", record=later)] == [
        "operator", "event", "event"]


def test_each_commit_row_says_how_to_read_the_table_as_of_it():
    [row] = timeline.rows([entry(11, 0, 1000)], [], [], "orders")
    assert row["asOf"] == "FOR VERSION AS OF 11" and "commitTime" not in row
    us = 1_700_000_000_123_456  # BigQuery's ledger: the snapshot is the commit time in µs
    [row] = timeline.rows([entry(us, 3, 1000)], [], [], "orders", bigquery=True)
    assert row["asOf"] == f"FOR SYSTEM_TIME AS OF TIMESTAMP_MICROS({us})"
    assert row["commitTime"] == "2023-11-14T22:13:20.123456Z" and "batch 3" in row["what"]
    assert timeline.format_text([row]).endswith("[BigQuery commit 2023-11-14T22:13:20.123456Z]")


def test_rows_of_the_same_moment_keep_the_order_they_were_recorded_in():
    record = [{"timeMs": 5, "type": "Normal", "reason": r, "message": r} for r in ("SpecChanged", "Scaled", "X")]
    assert [r["kind"] for r in timeline.rows([], [], [], "orders", record=record)] == ["X", "Scaled", "SpecChanged"]


def test_a_commit_row_counts_what_the_transform_dedupe_and_watermark_took_out():
    counted = dict(entry(14, 3, 4000), droppedRows=4, lateRows=2)
    (row,) = timeline.rows([counted], [], [], "orders")
    assert row["what"] == ("batch 3 (handoff): 5 rows, 1 dead letters, 4 dropped by the transform or dedupe, 2 late; "
                           "t[0] 15→20")
    (plain,) = timeline.rows([dict(entry(15, 4, 5000), droppedRows=0, lateRows=None)], [], [], "orders")
    assert plain["what"] == "batch 4 (handoff): 5 rows, 1 dead letters; t[0] 20→25"


def test_a_replay_step_orders_among_operator_entries_of_the_same_second():
    """Replay steps carry milliseconds (replay.handlers._now_ms), so a step taken 300 ms after an operator entry
    sorts after it, not before it as a whole-second time would."""
    from handoff_operator.replay.handlers import _now_ms

    step_at = _now_ms()
    assert len(step_at) == len("2026-11-28T14:34:48.959Z") and step_at.endswith("Z")
    request = {"metadata": {"name": "r2"}, "spec": {"handoffRef": {"name": "orders"}, "mode": "Rollback"},
               "status": {"steps": [{"name": "Tagged", "at": "1970-01-01T00:00:09.900Z"}]}}
    record = [{"timeMs": 9_600, "type": "Normal", "reason": "RetentionEnforced", "message": "raised"}]
    rows = timeline.rows([], [], [request], "orders", record=record)
    assert [r["kind"] for r in rows] == ["Tagged", "RetentionEnforced"]


def test_a_commit_that_changed_the_tables_schema_has_a_schema_row_below_it():
    changed = dict(entry(21, 5, 6000), schemaId=1, schemaChange={
        "from": 0, "to": 1, "added": ["note string", "score double"], "dropped": [], "changed": ["id int → long"]})
    rows = timeline.rows([changed, dict(entry(20, 4, 5000), schemaId=0, schemaChange=None)], [], [], "orders")
    assert [(r["kind"], r["snapshot"]) for r in rows] == [("batch", 21), ("schema", 21), ("batch", 20)]
    assert rows[1]["what"] == "schema 0 → 1: added note string, score double; changed id int → long"
    assert rows[1]["asOf"] == "FOR VERSION AS OF 21"
