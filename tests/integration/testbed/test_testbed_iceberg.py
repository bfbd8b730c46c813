"""Smoke tests of the Iceberg catalogs the test bed offers: PyIceberg SqlCatalog on SQLite (no
server), on the PostgreSQL fixture, and with its warehouse on the S3 (moto) fixture.

Each round-trips an append that carries snapshot properties, because that is where Handoff records
the Kafka offsets a commit contains; reading them back through a fresh catalog handle proves they
are durable catalog state and not just in-memory.
"""
from __future__ import annotations

import datetime as dt
import uuid

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform
from pyiceberg.types import LongType, NestedField, StringType, TimestampType

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "ts", TimestampType(), required=False),
    NestedField(3, "payload", StringType(), required=False),
)
ARROW_SCHEMA = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us")), ("payload", pa.string())])


def _rows(n: int, days: int = 1) -> pa.Table:
    start = dt.datetime(2026, 1, 1)
    return pa.table({
        "id": list(range(n)),
        "ts": [start + dt.timedelta(days=i % days, seconds=i) for i in range(n)],
        "payload": [f"p{i}" for i in range(n)],
    }, schema=ARROW_SCHEMA)


def _append_and_read_back(make_catalog, partition_spec: PartitionSpec | None = None,
                           days: int = 1) -> None:
    namespace = f"ns_{uuid.uuid4().hex[:8]}"
    identifier = f"{namespace}.events"
    catalog = make_catalog()
    catalog.create_namespace(namespace)
    kwargs = {"partition_spec": partition_spec} if partition_spec is not None else {}
    table = catalog.create_table(identifier, schema=SCHEMA, **kwargs)
    data = _rows(30, days=days)
    table.append(data, snapshot_properties={"handoff.offsets": '{"0": 30}', "handoff.batch": "7"})

    fresh = make_catalog().load_table(identifier)  # a second handle: state came from the catalog
    summary = fresh.current_snapshot().summary
    assert summary["handoff.offsets"] == '{"0": 30}'
    assert summary["handoff.batch"] == "7"
    assert int(summary["added-records"]) == 30
    got = fresh.scan().to_arrow().sort_by("id")
    assert got.equals(data.sort_by("id"))
    filtered = fresh.scan(row_filter="id >= 25").to_arrow()
    assert sorted(filtered["id"].to_pylist()) == [25, 26, 27, 28, 29]
    if partition_spec is not None:
        files = list(fresh.scan().plan_files())
        assert len(files) == days  # one data file per day partition
        per_file_days = {f.file.partition[0] for f in files}
        assert len(per_file_days) == days


def test_sqlite_catalog(tmp_path):
    def make():
        return SqlCatalog("sqlite", uri=f"sqlite:///{tmp_path}/catalog.db",
                          warehouse=f"file://{tmp_path}/warehouse")

    _append_and_read_back(make)


def test_postgres_catalog(postgres, tmp_path):
    def make():
        return SqlCatalog("pg", uri=postgres.env["ICEBERG_PG_URI"], warehouse=f"file://{tmp_path}/warehouse")

    _append_and_read_back(make)
    # the catalog rows really live in PostgreSQL
    conn = postgres.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM iceberg_tables WHERE catalog_name = 'pg'")
            assert cur.fetchone()[0] >= 1
    finally:
        conn.close()


def test_s3_warehouse_with_day_partitions(s3, tmp_path):
    bucket = f"wh-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)

    def make():
        return SqlCatalog("s3", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"s3://{bucket}/warehouse",
                          **s3.iceberg_properties())

    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=DayTransform(), name="ts_day"))
    _append_and_read_back(make, partition_spec=spec, days=3)
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert sum(k.endswith(".parquet") for k in keys) == 3
    assert any(k.endswith(".metadata.json") for k in keys)

