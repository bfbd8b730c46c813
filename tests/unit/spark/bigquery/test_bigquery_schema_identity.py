"""A BigQuery table's schema identity and what a ledger entry says changed (issue 35, the timeline's `schema`
rows): BigQuery has no schema ids, so each ledger-index row records a fingerprint of the table's columns and, on
some rows, the columns themselves; `schema_changes` makes Iceberg's `schemaChange` shape from them. Pure."""
from __future__ import annotations

from handoff_spark.bigquery.ledger import schema_changes
from handoff_spark.bigquery.schema import Field, column_types, fingerprint
from handoff_spark.iceberg.ledger import schema_change as iceberg_schema_change
from handoff_spark.ledger.record import BATCH, GAP, Commit

BASE = (Field("id", "INTEGER"), Field("_kafka_topic", "STRING", "REQUIRED"))


def test_column_types_say_the_type_as_bigquery_does_with_the_mode_and_nested_shape():
    fields = BASE + (Field("tags", "STRING", "REPEATED"),
                     Field("addr", "RECORD", "NULLABLE", (Field("City", "STRING"), Field("n", "FLOAT"))))
    assert column_types(fields) == {"id": "INT64", "_kafka_topic": "STRING REQUIRED", "tags": "STRING REPEATED",
                                    "addr": "RECORD<city STRING, n FLOAT64>"}


def test_the_fingerprint_is_of_the_columns_alone_and_tells_schemas_apart():
    one = column_types(BASE)
    assert fingerprint(one) == fingerprint(column_types((Field("id", "INT64"), Field("_kafka_topic", "STRING",
                                                                                       "REQUIRED"))))
    assert len(fingerprint(one)) == 12 and int(fingerprint(one), 16) >= 0
    assert fingerprint(one) != fingerprint(column_types(BASE + (Field("note", "STRING"),)))
    assert fingerprint(one) != fingerprint(column_types((Field("id", "INT64", "REQUIRED"), BASE[1])))


def _entry(batch: int, schema_id: str | None, columns: dict[str, str] | None = None, kind: str = BATCH) -> Commit:
    return Commit(snapshot_id=batch, timestamp_ms=batch, handoff_id="ns/h", query="handoff", batch_id=batch,
                  offsets={}, rows=1, dlq_rows=0, max_event_time_ms=None, kind=kind, schema_id=schema_id,
                  columns=columns)


def test_a_change_is_told_against_the_entry_before_that_recorded_a_schema():
    old = {"id": "INT64", "x": "STRING REQUIRED"}
    new = {"id": "INT64", "x": "STRING", "note": "STRING"}
    a, b = fingerprint(old), fingerprint(new)
    # newest first: 4 (same as 3, no columns of its own), a gap marker (no schema), 3 changed, 2 and 1 unchanged
    commits = [_entry(4, b), _entry(-1, None, kind=GAP), _entry(3, b, new), _entry(2, a), _entry(1, a, old)]
    changes = schema_changes(commits)
    assert changes == [None, None, {"from": a, "to": b, "added": ["note STRING"], "dropped": [],
                                    "changed": ["x STRING REQUIRED → STRING"]}, None, None]
    # across a marker: the entry before the newest with a schema is 3 (same schema), not the gap
    assert schema_changes([_entry(5, a, old), _entry(-1, None, kind=GAP), _entry(4, b, new)])[0] == {
        "from": b, "to": a, "added": [], "dropped": ["note"], "changed": ["x STRING → STRING REQUIRED"]}


def test_no_change_is_claimed_where_it_cannot_be_told():
    old = {"id": "INT64"}
    # rows of an older Handoff (no schema), and a schema whose columns no remaining row carries
    assert schema_changes([_entry(2, fingerprint(old), old), _entry(1, None)]) == [None, None]
    assert schema_changes([_entry(2, fingerprint(old), old), _entry(1, "0123456789ab")]) == [None, None]
    assert schema_changes([]) == []


def test_both_backends_say_a_change_in_the_same_shape():
    """Iceberg's `schema_change` and BigQuery's `schema_changes` share `ledger.record.column_change`, so the
    timeline renders either the same way."""
    from pyiceberg.schema import Schema
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
    from pyiceberg.types import LongType, NestedField, StringType

    meta = new_table_metadata(Schema(NestedField(1, "id", LongType(), required=False)), UNPARTITIONED_PARTITION_SPEC,
                              UNSORTED_SORT_ORDER, "file:///t", {})
    newer = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "note", StringType(),
                                                                                 required=False), schema_id=1)
    meta = meta.model_copy(update={"schemas": [*meta.schemas, newer]})
    iceberg = iceberg_schema_change(meta, 0, 1)
    bq = schema_changes([_entry(2, "b", {"id": "INT64", "note": "STRING"}), _entry(1, "a", {"id": "INT64"})])[0]
    assert iceberg is not None and bq is not None
    assert set(iceberg) == set(bq) == {"from", "to", "added", "dropped", "changed"}
    assert (iceberg["added"], bq["added"]) == (["note string"], ["note STRING"])
