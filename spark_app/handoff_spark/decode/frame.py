"""Decoded records as the Arrow batches of a Spark DataFrame: one fixed schema, so Spark can take them.

Why: issue 31's data path hands Spark the *decoded* batch (declared columns plus the Kafka coordinates) for a SQL
transform, a dedupe and event time. A Python data source's batches, and a `mapInArrow` function's, must have
exactly the Arrow schema of the Spark schema the query was planned with (Spark compares the two, nullability
included), while `decode_source` shapes each batch by what it found: under `evolution=compatible` it adds the
undeclared fields it met, and its Kafka columns' nullability is its own. `frame_schema` is the one schema for a
handoff's frame; `decoded_frames` decodes raw record batches as they arrive and conforms each to it.

What the frame holds: the declared columns (declared order; a required one not nullable), then `_kafka_topic`,
`_kafka_partition`, `_kafka_offset`, `_kafka_timestamp`. Columns `evolution=compatible` discovers in a batch are
not in it: a query's schema is fixed when it is planned (docs/design/spark-data-path.md). Used so far by
`bench/spark/sink/dataframe_path.py` only; the product's sinks still decode in their own write tasks.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa

from handoff_spark.config import AppConfig
from handoff_spark.contract import KAFKA_OFFSET, KAFKA_PARTITION, KAFKA_TIMESTAMP, KAFKA_TOPIC
from handoff_spark.decode.batch import decode_source
from handoff_spark.decode.records import DeadLetter, declared_arrow_schema

#: The Kafka coordinates every frame row carries, after the declared columns (nullable: Spark's side of them).
KAFKA_FIELDS = (pa.field(KAFKA_TOPIC, pa.string()), pa.field(KAFKA_PARTITION, pa.int32()),
                pa.field(KAFKA_OFFSET, pa.int64()), pa.field(KAFKA_TIMESTAMP, pa.timestamp("us", tz="UTC")))

#: What a frame does with a batch's dead letters: `(raw batch, its dead letters)`, before its rows are yielded
#: (the sinks' rule: a dead letter is durable before the task that found it reports success).
DeadLetterSink = Callable[[pa.Table, list[DeadLetter]], None]


def frame_schema(cfg: AppConfig) -> pa.Schema:
    """The frame's Arrow schema: declared columns, then the Kafka coordinates. Equal to
    `to_arrow_schema(from_arrow_schema(frame_schema(cfg)), timezone="UTC")`, which is what Spark checks."""
    return pa.schema([*declared_arrow_schema(cfg.schema_), *KAFKA_FIELDS])


def conform(decoded: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    """`decoded` (a `decode_source` table) as one batch of exactly `schema`: its columns by name, cast to the
    schema's types; a declared column the batch lacks is null (a nullable column absent from every record);
    columns the schema lacks are dropped."""
    arrays = []
    for f in schema:
        if f.name in decoded.column_names:
            col = decoded.column(f.name).combine_chunks()
            arrays.append(col if col.type == f.type else col.cast(f.type))
        else:
            arrays.append(pa.nulls(decoded.num_rows, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def decoded_frames(raw_batches: Iterable[pa.RecordBatch], cfg: AppConfig, schema: pa.Schema,
                   dead_letters: DeadLetterSink) -> Iterator[pa.RecordBatch]:
    """Each raw record batch decoded (`decode_source`, the sinks' decoder) and conformed to `schema`, as it
    arrives: the reader's next fetch overlaps Spark's work on this batch. A batch's dead letters go to
    `dead_letters` first; a batch that is all dead letters yields nothing."""
    for raw in raw_batches:
        if not raw.num_rows:
            continue
        table = pa.Table.from_batches([raw])
        decoded, dead, _schemas = decode_source(table, cfg)
        if dead:
            dead_letters(table, dead)
        if decoded.num_rows:
            yield conform(decoded, schema)
