"""Which DataFrame path through Spark is fast (issue 31, item 4): records as Spark rows into the same sink, measured
against the raw consumer and today's fused path in the same run.

Today the fused path plans Kafka offset ranges as Spark's rows and the write task reads, decodes and writes them
itself: no record is ever a Spark row, so Spark cannot transform, dedupe or watermark them. Issue 31 wants the
decoded batch to be a DataFrame. This script measures the candidate ways of doing that, on one topic of `--records`
JSON orders (the throughput bench's records; every 50th repeats the order 25 records before it, a duplicate order
id), each from the topic's start to its end (AvailableNow), all into the Iceberg sink with the same ledger commit
(`commit_batch`: the batch's ranges from Spark's offset log) unless the name says `noop` (Spark's `noop` sink) or
`null` (a Python Arrow writer that takes the rows and drops them: the hand-over to a Python writer, without Iceberg).

Baselines:
  raw-consume          one confluent-kafka consumer counting records (`bench_pipelines.raw_consume`, best of 3 warm passes)
  fused                today's default: `handoff-kafka-ranges` → `handoff-iceberg` (the write task reads, decodes, writes)
Candidates (issue 31's letters):
  a  records-iceberg   today's record source `handoff-kafka` → `handoff-iceberg` (HANDOFF_FUSED_READ=0)
     records-noop      the record source alone; records-null: its rows handed to a Python Arrow writer;
                       records-noheaders-null, records-value-null: the same without `headers`, `value` alone
  b  decoded-iceberg   a source yielding decoded Arrow batches (`decode.frame`: declared columns + `_kafka_*`) →
                       an Iceberg writer taking rows (`iceberg.sink.write_rows_task`)
     decoded-noop, decoded-null
  c  decoded-sql-iceberg        b with the SQL below between (projection, a derived column, a filter)
     decoded-sql-dedupe-iceberg b with the SQL and `withWatermark(ts, 1 hour).dropDuplicatesWithinWatermark(id)`
  d  mapinarrow-iceberg, mapinarrow-sql-dedupe-iceberg: `handoff-kafka-ranges` → `mapInArrow` (read + decode in
                       the Python worker) → [SQL + dedupe] → the same writer
  e  jvm-fromjson-iceberg, jvm-fromjson-sql-dedupe-iceberg: Spark's JVM Kafka source → `from_json` → [SQL + dedupe]
                       → the same writer; jvm-noop: the JVM source alone; jvm-raw-iceberg: its raw columns into
                       `handoff-iceberg` (which decodes), the issue's "JVM source into the same sink"
Each candidate writes to a fresh table and checkpoint per pass; its rows are checked (the table's row count, and
for a dedupe no order id twice). Rates are Kafka records per second (`--records` / the pass's seconds), whatever the
transform kept. Where the time went: Python-side timings inside the source's and writers' workers (their own work
against waiting on the JVM, the Arrow batches they got), Spark's stage metrics (task run and JVM CPU time, GC,
shuffle) and each process kind's CPU (`proc_cpu`).

What the runs found (docs/design/spark-data-path.md, docs/benchmarks.md "Which DataFrame path"): the record path's ~22×
is Spark's per-row byte-size check on the Arrow batches it hands a Python worker, quadratic for a list column such
as `headers`; `--sql-conf spark.sql.execution.arrow.maxBytesPerBatch=2147483647` turns it off.

`--jit c1,c2` runs the Spark candidates once per JIT setting, each in a process of its own (a Python process keeps
its first JVM): `c1` is the product's default (`HANDOFF_JVM_C1_ONLY`, C1-only JVMs: Handoff's JVMs never moved
records), `c2` the JVM's default tiered compilation, which a JVM that carries records may need.

    PYTHONPATH=spark_app:operator .venv/bin/python bench/spark/sink/dataframe_path.py [--records 1000000]
        [--partitions 3] [--passes 2] [--jit c1,c2] [--candidates fused,records-iceberg,...] [--bootstrap HOST:PORT]
        [--state-store rocksdb|hdfs] [--sql-conf KEY=VALUE ...] [--source-option KEY=VALUE ...]
`--sql-conf` and `--source-option` are for profiling (e.g. `spark.sql.execution.arrow.maxRecordsPerBatch`, the rows per
Arrow batch Spark hands a Python writer; `consumeBatch`, the rows per batch the Handoff sources read).

Prints a table and writes bench/results/dataframe_path.json.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "spark_app"))
sys.path.insert(0, str(ROOT / "hack"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_kafka import add_broker_argument, broker  # noqa: E402
from bench_report import add_out_argument, machine_facts, one_decimal, write_json  # noqa: E402
from bench_pipelines import COLUMNS, await_query, best_of, measured, raw_consume, spark_kafka_jars  # noqa: E402
from bench_pipelines import produce as shared_produce  # noqa: E402

#: The transform of candidates c, d and e: a projection with a derived column and a filter (~10 % of the orders
#: have an amount under 50). Its output has the table's columns.
SQL = ("SELECT id, ts, upper(customer) AS customer, amount, region, _kafka_topic, _kafka_partition, _kafka_offset, "
       "_kafka_timestamp FROM source WHERE amount >= 50")
MIN_AMOUNT = 50
DEDUPE_KEY = "id"
WATERMARK = "1 hour"
DUP_EVERY, DUP_BACK = 50, 25  # record i with i % 50 == 49 repeats record i - 25

CANDIDATES = ("fused", "records-noop", "records-null", "records-noheaders-null", "records-value-null",
              "records-iceberg", "decoded-noop", "decoded-null",
              "decoded-iceberg", "decoded-sql-iceberg", "decoded-sql-dedupe-iceberg", "mapinarrow-iceberg",
              "mapinarrow-sql-dedupe-iceberg", "jvm-noop", "jvm-raw-iceberg", "jvm-fromjson-iceberg",
              "jvm-fromjson-sql-dedupe-iceberg", "product-fused", "product-frame", "product-sql-dedupe")
#: The dedupe's state store (`--state-store`). Spark's default keeps every key in the JVM heap: the first 1M-record
#: runs, at the default 1 GiB, failed with OutOfMemoryError once a few dedupe queries' stores were loaded.
STATE_STORE_KEY = "spark.sql.streaming.stateStore.providerClass"
STATE_STORES = {"rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
                "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"}
#: Settings whose effective values each Spark part records (what the JSON's numbers were measured under).
REPORTED_CONF = ("spark.sql.execution.arrow.maxRecordsPerBatch", "spark.sql.execution.arrow.maxBytesPerBatch",
                 "spark.sql.execution.arrow.useLargeVarTypes", "spark.sql.shuffle.partitions", STATE_STORE_KEY,
                 "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "spark.driver.memory",
                 "spark.driver.extraJavaOptions")
DECODED_SOURCE = "bench-kafka-decoded"
NULL_SINK = "bench-null-arrow"
ROWS_SINK = "bench-iceberg-rows"


# ----------------------------------------------------------------------------------------------------- the data

def order(k: int) -> dict[str, Any]:
    """Order k: the throughput bench's record (same fields, sizes and spread)."""
    ts = (dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(milliseconds=k)).isoformat(
        timespec="milliseconds")
    return {"id": k, "ts": ts, "customer": f"c{k % 9973:05d}", "amount": round(k * 0.37 % 500, 2),
            "region": ("eu", "us", "ap")[k % 3], "note": "x" * 60}


def order_of_record(i: int) -> int:
    return i - DUP_BACK if i % DUP_EVERY == DUP_EVERY - 1 else i


def expected_rows(records: int) -> dict[str, int]:
    """Rows each kind of candidate must leave in its table: every record (no transform), the records the filter
    keeps (SQL), the distinct orders among those (SQL + dedupe)."""
    kept = [k for k in map(order_of_record, range(records)) if order(k)["amount"] >= MIN_AMOUNT]
    return {"all": records, "sql": len(kept), "sql-dedupe": len(set(kept))}


def produce(bootstrap: str, topic: str, records: int) -> int:
    """The throughput bench's producer, with every 50th record a duplicate order (`order_of_record`)."""
    return shared_produce(bootstrap, topic, records, lambda i: json.dumps(order(order_of_record(i))).encode())


# ------------------------------------------------------------------------- Spark pieces (pickled by value)
# Spark pickles these classes into its Python workers; defined in the script (`__main__`), cloudpickle sends them
# by value, so the workers need only handoff_spark on their path.

def _stats_line(stats_dir: str | None, doc: dict[str, Any]) -> None:
    """One JSON line per task, for the bench to add up after the pass (the workers are other processes)."""
    if stats_dir:
        with open(os.path.join(stats_dir, f"{os.getpid()}-{uuid.uuid4().hex[:8]}.json"), "w") as f:
            json.dump(doc, f)


def _timed_source(it: Iterator[Any], stats_dir: str | None, kind: str) -> Iterator[Any]:
    """Yield from `it`, timing the work inside it (read + decode) apart from the time the batches wait to be taken
    (the JVM's side of the hand-over)."""
    work = wait = 0.0
    rows = batches = 0
    t0 = time.perf_counter()
    while True:
        t = time.perf_counter()
        try:
            b = next(it)
        except StopIteration:
            break
        work += time.perf_counter() - t
        rows += b.num_rows
        batches += 1
        t = time.perf_counter()
        yield b
        wait += time.perf_counter() - t
    _stats_line(stats_dir, {"kind": kind, "rows": rows, "batches": batches, "work_s": work, "wait_s": wait,
                            "wall_s": time.perf_counter() - t0})


def _timed_input(it: Iterator[Any], stats: dict[str, Any]) -> Iterator[Any]:
    """A writer's input, timing the waits for each next batch (the JVM and everything upstream of the writer)."""
    sizes: list[int] = []
    while True:
        t = time.perf_counter()
        try:
            b = next(it)
        except StopIteration:
            stats["wait_s"] = stats.get("wait_s", 0.0) + time.perf_counter() - t
            break
        stats["wait_s"] = stats.get("wait_s", 0.0) + time.perf_counter() - t
        sizes.append(b.num_rows)
        yield b
    stats.update(rows=sum(sizes), batches=len(sizes), max_batch=max(sizes, default=0))


def _dead_letters(cfg: Any) -> Callable[[Any, list[Any]], None]:
    from handoff_spark.sink.dead_letters import send_dead_letters

    return lambda raw, dead: send_dead_letters(cfg, raw, dead)


def _decoded_reader_class() -> Any:
    from handoff_spark.kafka.source import HandoffKafkaDataSource, KafkaStreamReader, SourceOptions

    class DecodedReader(KafkaStreamReader):
        def __init__(self, opts: Any, config_json: str, stats_dir: str | None) -> None:
            super().__init__(opts)
            self.config_json, self.stats_dir = config_json, stats_dir

        def __getstate__(self) -> dict[str, Any]:
            return {**super().__getstate__(), "config_json": self.config_json, "stats_dir": self.stats_dir}

        def read(self, partition: Any) -> Iterator[Any]:
            from handoff_spark.config import AppConfig
            from handoff_spark.decode.frame import decoded_frames, frame_schema
            from handoff_spark.kafka.source import read_range

            cfg = AppConfig.model_validate_json(self.config_json)
            schema = frame_schema(cfg)

            def frames() -> Iterator[Any]:
                for rng in partition.ranges:
                    yield from decoded_frames(read_range(self.opts, rng), cfg, schema, _dead_letters(cfg))
            yield from _timed_source(frames(), self.stats_dir, "source")

    class DecodedSource(HandoffKafkaDataSource):
        """`handoff-kafka`'s offsets, planning and checkpoint files; its batches decoded (`decode.frame`)."""

        @classmethod
        def name(cls) -> str:
            return DECODED_SOURCE

        def schema(self) -> Any:
            from pyspark.sql.pandas.types import from_arrow_schema

            from handoff_spark.config import AppConfig
            from handoff_spark.decode.frame import frame_schema

            return from_arrow_schema(frame_schema(AppConfig.model_validate_json(self.options["config"])))

        def streamReader(self, schema: Any) -> Any:  # noqa: N802
            return DecodedReader(SourceOptions.parse(self.options), self.options["config"],
                                 self.options.get("statsdir"))

    return DecodedSource


def _sink_classes() -> tuple[Any, Any]:
    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

    from handoff_spark.iceberg.stream import IcebergStreamWriter

    class NullWriter(DataSourceStreamArrowWriter):
        def __init__(self, stats_dir: str | None) -> None:
            self.stats_dir = stats_dir

        def write(self, iterator: Iterator[Any]) -> Any:
            stats: dict[str, Any] = {"kind": "writer"}
            t0 = time.perf_counter()
            for _ in _timed_input(iterator, stats):
                pass
            stats["wall_s"] = time.perf_counter() - t0
            _stats_line(self.stats_dir, stats)
            return WriterCommitMessage()

        def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
            pass

        def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
            pass

    class NullSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return NULL_SINK

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:  # noqa: N802
            return NullWriter(self.options.get("statsdir"))

    class RowsWriter(IcebergStreamWriter):
        """`handoff-iceberg`'s writer over decoded rows: `write_rows_task`, and the same commit (`commit_batch`)."""

        def __init__(self, config_json: str, stats_dir: str | None) -> None:
            super().__init__(config_json)
            self.stats_dir = stats_dir

        def write(self, iterator: Iterator[Any]) -> Any:
            from handoff_spark.iceberg.sink import write_rows_task

            stats: dict[str, Any] = {"kind": "writer"}
            t0 = time.perf_counter()
            msg = write_rows_task(self.cfg, _timed_input(iterator, stats))
            stats["wall_s"] = time.perf_counter() - t0
            _stats_line(self.stats_dir, stats)
            return msg

    class RowsSink(DataSource):
        @classmethod
        def name(cls) -> str:
            return ROWS_SINK

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:  # noqa: N802
            return RowsWriter(self.options["config"], self.options.get("statsdir"))

    return NullSink, RowsSink


def _read_decode(config_json: str, stats_dir: str | None) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """Candidate d's `mapInArrow` function: a task's `handoff-kafka-ranges` rows → their records, decoded."""

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        from handoff_spark.config import AppConfig
        from handoff_spark.decode.frame import decoded_frames, frame_schema
        from handoff_spark.kafka.source import SourceOptions, ranges_of, read_range, source_options

        cfg = AppConfig.model_validate_json(config_json)
        opts = SourceOptions.parse(source_options(cfg, None))
        schema = frame_schema(cfg)

        def frames() -> Iterator[Any]:
            for rng in ranges_of(batches):
                yield from decoded_frames(read_range(opts, rng), cfg, schema, _dead_letters(cfg))
        yield from _timed_source(frames(), stats_dir, "source")
    return fn


# ---------------------------------------------------------------------------------------------- the queries

def make_cfg(bootstrap: str, topic: str, tmp: Path, name: str) -> Any:
    from handoff_spark.config import AppConfig

    return AppConfig.model_validate({
        "handoffId": f"bench/{name}", "source": {"bootstrapServers": bootstrap, "topics": [topic]},
        "sink": {"kind": "iceberg", "catalogName": f"bench-{name}", "table": "bench.handoff",
                 "catalogProperties": {"type": "sql", "uri": f"sqlite:///{tmp}/{name}.db",
                                       "warehouse": f"file://{tmp}/{name}-wh"}},
        "schema": {"columns": COLUMNS, "onIncompatible": "halt", "evolution": "none"},
        "checkpointLocation": str(tmp / f"ck-{name}")})


def _source_options(spark: Any, cfg: Any) -> dict[str, str]:
    from handoff_spark.driver.app import MIN_PARTITIONS_PER_CORE
    from handoff_spark.kafka.source import source_options

    opts = source_options(cfg, None)
    opts.setdefault("minPartitions", str(MIN_PARTITIONS_PER_CORE * spark.sparkContext.defaultParallelism))
    return opts


def _transformed(spark: Any, df: Any, name: str) -> Any:
    """`df` (the frame) through the candidate's transform: none, the SQL, or the SQL and the dedupe. A dedupe
    candidate runs without Spark's no-data batches, as the product's does (`driver.app.no_data_batches`), so the
    baselines and Handoff's path do the same batches; the others get Spark's default."""
    from handoff_spark.driver.app import NO_DATA_BATCHES_KEY

    spark.conf.set(NO_DATA_BATCHES_KEY, "false" if "-dedupe" in name else "true")
    if "-sql" not in name:
        return df
    view = f"source_{uuid.uuid4().hex[:8]}"
    df.createOrReplaceTempView(view)
    out = spark.sql(SQL.replace("FROM source", f"FROM {view}"))
    if "-dedupe" in name:
        out = out.withWatermark("ts", WATERMARK).dropDuplicatesWithinWatermark([DEDUPE_KEY])
    return out


def _jvm_frame(spark: Any, cfg: Any, topic: str, partitions: int, raw_columns: bool) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from handoff_spark.checkpoint import INITIAL_OFFSETS_FILE
    from handoff_spark.decode.records import declared_arrow_schema
    from handoff_spark.driver.app import MIN_PARTITIONS_PER_CORE

    ck = Path(cfg.checkpoint_location)
    # The sink takes batch 0's start from the source's initial-offsets file; the JVM source does not write it.
    (ck / INITIAL_OFFSETS_FILE).parent.mkdir(parents=True, exist_ok=True)
    (ck / INITIAL_OFFSETS_FILE).write_text(json.dumps({topic: {str(p): 0 for p in range(partitions)}}))
    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", cfg.source.bootstrap_servers)
          .option("subscribe", topic).option("startingOffsets", "earliest")
          .option("kafka.isolation.level", "read_committed")
          .option("minPartitions", str(MIN_PARTITIONS_PER_CORE * spark.sparkContext.defaultParallelism)))
    if raw_columns:
        return (df.option("includeHeaders", "true").load()
                .select("topic", "partition", "offset", "timestamp", "key", "value", "headers"))
    declared = from_arrow_schema(declared_arrow_schema(cfg.schema_))
    return (df.load().select(F.from_json(F.col("value").cast("string"), declared).alias("r"),
                             F.col("topic").alias("_kafka_topic"), F.col("partition").alias("_kafka_partition"),
                             F.col("offset").alias("_kafka_offset"), F.col("timestamp").alias("_kafka_timestamp"))
            .select("r.*", "_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp"))


def map_in_arrow(spark: Any, df: Any, fn: Callable[[Iterator[Any]], Iterator[Any]], schema: Any) -> Any:
    """`df.mapInArrow(fn, schema)` without PySpark's check that pandas is installed (`mapInArrow` makes its UDF
    through `pandas_udf`, which refuses without pandas, although neither the driver nor the workers use pandas for
    Arrow batches; the Python data sources run the same eval type without it). Handoff's image has no pandas."""
    from pyspark.sql import DataFrame
    from pyspark.sql.udf import UserDefinedFunction
    from pyspark.util import PythonEvalType

    udf = UserDefinedFunction(fn, returnType=schema, name=getattr(fn, "__name__", "fn"),
                              evalType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
    column = udf(*[df[c] for c in df.columns])
    return DataFrame(df._jdf.mapInArrow(column._jc, False, None), spark)


def start_candidate(spark: Any, cfg: Any, name: str, topic: str, partitions: int, stats_dir: str,
                    source_extra: dict[str, str]) -> Any:
    """Start candidate `name`'s AvailableNow query over `cfg`'s topic (see the module docstring). `fused` and
    `records-iceberg` are what `driver.app.start_query` starts (with and without `HANDOFF_FUSED_READ`)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from handoff_spark.decode.frame import frame_schema
    from handoff_spark.kafka.source import RANGES_SOURCE_NAME, SOURCE_NAME

    def handoff_source(fmt: str) -> Any:
        reader = spark.readStream.format(fmt)
        for k, v in {**_source_options(spark, cfg), **source_extra}.items():
            reader = reader.option(k, v)
        return reader

    if name.startswith("product-"):  # what Handoff itself runs for such a spec (driver.app.start_query)
        from handoff_spark.driver.app import start_query

        return start_query(spark, product_cfg(cfg, name), available_now=True)
    if name.startswith("jvm-"):
        df = _jvm_frame(spark, cfg, topic, partitions, raw_columns=name in ("jvm-noop", "jvm-raw-iceberg"))
    elif name == "fused":
        df = handoff_source(RANGES_SOURCE_NAME).load()
    elif name.startswith("records-"):
        df = handoff_source(SOURCE_NAME).load()
        if "-noheaders" in name:  # profiling: the record columns without `headers` (array<struct<…>>)
            df = df.drop("headers")
        elif "-value-" in name:  # profiling: `value` alone (binary)
            df = df.select("value")
    elif name.startswith("decoded-"):
        df = handoff_source(DECODED_SOURCE).option("config", cfg.to_json()).option("statsdir", stats_dir).load()
    elif name.startswith("mapinarrow-"):
        df = map_in_arrow(spark, handoff_source(RANGES_SOURCE_NAME).load(), _read_decode(cfg.to_json(), stats_dir),
                          from_arrow_schema(frame_schema(cfg)))
    else:
        raise ValueError(f"unknown candidate {name}")
    df = _transformed(spark, df, name)
    if name.endswith("-noop"):
        writer = df.writeStream.format("noop")
    elif name.endswith("-null"):
        writer = df.writeStream.format(NULL_SINK).option("statsdir", stats_dir)
    elif name in ("fused", "records-iceberg", "jvm-raw-iceberg"):  # the product's sink, which decodes
        writer = df.writeStream.format("handoff-iceberg").option("config", cfg.to_json())
    else:
        writer = df.writeStream.format(ROWS_SINK).option("config", cfg.to_json()).option("statsdir", stats_dir)
    return writer.option("checkpointLocation", cfg.checkpoint_location).trigger(availableNow=True).start()


def product_cfg(cfg: Any, name: str) -> Any:
    """The bench's config as a handoff spec would make it for candidate `name`: `product-fused` no transform (the
    fused path), `product-frame` a transform that keeps every column (the DataFrame path, no SQL cost),
    `product-sql-dedupe` the bench's SQL, a dedupe on the order id and event time on `ts` (both an hour)."""
    if name == "product-fused":
        return cfg
    fields: dict[str, Any] = {"deadLetterTopic": "bench-dfp-dlq", "transform": {"sql": "SELECT * FROM source"}}
    if name == "product-sql-dedupe":
        fields.update(transform={"sql": SQL}, dedupe={"keys": [DEDUPE_KEY], "withinSeconds": 3600},
                      eventTime={"column": "ts", "watermarkSeconds": 3600})
    return type(cfg).model_validate({**json.loads(cfg.to_json()), **fields})


def writes_iceberg(name: str) -> bool:
    return name == "fused" or name.endswith("-iceberg") or name.startswith("product-")


def expected_kind(name: str) -> str:
    return "sql-dedupe" if "-dedupe" in name else "sql" if "-sql" in name else "all"


# ---------------------------------------------------------------------------------- where the time went

def stage_totals(spark: Any) -> dict[str, float]:
    """Spark's task metrics summed over every stage so far (the status store: no UI needed): task run time, the
    task threads' JVM CPU, GC, shuffle bytes."""
    sc = spark.sparkContext
    jvm = sc._jvm
    # stageList(statuses, details, withSummaries, unsortedQuantiles, taskStatus): empty lists = every stage.
    stages = sc._jsc.sc().statusStore().stageList(jvm.java.util.ArrayList(), False, False,
                                                  sc._gateway.new_array(jvm.double, 0), jvm.java.util.ArrayList())
    out = {"stages": 0.0, "tasks": 0.0, "run_s": 0.0, "jvm_cpu_s": 0.0, "gc_s": 0.0, "shuffle_write_mb": 0.0,
           "shuffle_read_mb": 0.0, "deserialize_s": 0.0}
    for i in range(stages.size()):
        s = stages.apply(i)
        out["stages"] += 1
        out["tasks"] += s.numCompleteTasks()
        out["run_s"] += s.executorRunTime() / 1000
        out["jvm_cpu_s"] += s.executorCpuTime() / 1e9
        out["gc_s"] += s.jvmGcTime() / 1000
        out["deserialize_s"] += s.executorDeserializeTime() / 1000
        out["shuffle_write_mb"] += s.shuffleWriteBytes() / 1e6
        out["shuffle_read_mb"] += s.shuffleReadBytes() / 1e6
    return out


def python_stats(stats_dir: Path) -> dict[str, dict[str, float]]:
    """The workers' per-task lines, added up by kind (`source`, `writer`)."""
    out: dict[str, dict[str, float]] = {}
    for p in stats_dir.glob("*.json"):
        doc = json.loads(p.read_text())
        acc = out.setdefault(doc.pop("kind"), {"tasks": 0})
        acc["tasks"] += 1
        for k, v in doc.items():
            acc[k] = max(acc.get(k, 0), v) if k == "max_batch" else acc.get(k, 0) + v
    return {kind: {k: round(v, 3) for k, v in acc.items()} for kind, acc in out.items()}


def table_check(cfg: Any, dedupe: bool) -> dict[str, Any]:
    """The table's rows, and for a dedupe the distinct order ids (they must be equal)."""
    import pyarrow.compute as pc

    from handoff_spark.iceberg.sink import open_table

    table = open_table(cfg, create=False)
    snap = table.current_snapshot()
    out: dict[str, Any] = {"table_rows": int(snap.summary["total-records"]) if snap else 0}
    if dedupe and snap:
        ids = table.scan(selected_fields=("id",)).to_arrow().column("id")
        out["distinct_ids"] = pc.count_distinct(ids).as_py()
    return out


def run_pass(spark: Any, bootstrap: str, topic: str, partitions: int, tmp: Path, name: str,
             records: int, source_extra: dict[str, str]) -> dict[str, Any]:
    from handoff_spark.driver.app import ProgressReporter
    from handoff_spark.sink import registry as sinks

    cfg = make_cfg(bootstrap, topic, tmp, name)
    stats_dir = tmp / "stats"
    stats_dir.mkdir()
    if writes_iceberg(name):
        sinks.get("iceberg").prepare(cfg)
    reporter = ProgressReporter(cfg, None, lambda _line: None)
    before = stage_totals(spark)
    t0 = time.perf_counter()
    query = start_candidate(spark, cfg, name, topic, partitions, str(stats_dir), source_extra)
    elapsed = await_query(query, reporter, t0)
    after = stage_totals(spark)
    batch_s = sum(r.duration_ms for r in reporter.reports) / 1000
    out: dict[str, Any] = {
        "records": records, "seconds": elapsed, "batch_seconds": batch_s, "batches": len(reporter.reports),
        "rows": sum(r.rows for r in reporter.reports),
        "spark": {k: round(after[k] - before[k], 3) for k in after}, "python": python_stats(stats_dir)}
    task_ms: dict[str, float] = {}
    for r in reporter.reports:
        for k, v in ((r.commit or {}).get("task_ms") or {}).items():
            task_ms[k] = round(task_ms.get(k, 0.0) + v, 1)
    if task_ms:
        out["task_ms"] = task_ms
    if writes_iceberg(name):
        out.update(table_check(cfg, "-dedupe" in name))
    return out


def conf_value(spark: Any, key: str) -> str | None:
    """The setting's effective value (its default when unset), None when Spark has neither."""
    try:
        return spark.conf.get(key)
    except Exception:  # noqa: BLE001 - not a registered SQL setting and not set
        return spark.sparkContext.getConf().get(key)


def run_spark_candidates(bootstrap: str, topic: str, warm_topic: str, partitions: int, records: int,
                         candidates: list[str], passes: int, jit: str, sql_conf: dict[str, str],
                         source_extra: dict[str, str], spark_conf: dict[str, str]) -> dict[str, Any]:
    """Every candidate, warmed up on the small topic first, then `passes` passes; in this process's session, with
    `sql_conf` set on it and `source_extra` given to the Handoff sources (profiling variants)."""
    from handoff_spark.config import AppConfig
    from handoff_spark.driver.app import build_session

    os.environ["HANDOFF_JVM_C1_ONLY"] = "1" if jit == "c1" else "0"
    tmp = Path(tempfile.mkdtemp(prefix="bench-dfp-"))
    results: dict[str, Any] = {}
    try:
        jars = {"spark.jars": ",".join(spark_kafka_jars())} if any(c.startswith("jvm-") for c in candidates) else {}
        cfg = AppConfig.model_validate({"handoffId": "bench/x", "source": {"bootstrapServers": bootstrap,
                                                                           "topics": [topic]},
                                        "sink": {"kind": "iceberg", "table": "bench.x"},
                                        "schema": {"onIncompatible": "halt"}, "checkpointLocation": str(tmp),
                                        "sparkConf": {"spark.master": os.environ.get("BENCH_MASTER", "local[2]"),
                                                      **jars, **spark_conf}})
        t = time.perf_counter()
        spark = build_session(cfg)
        results["spark-session-start"] = {"seconds": time.perf_counter() - t}
        for k, v in sql_conf.items():
            spark.conf.set(k, v)
        results["_conf"] = {k: conf_value(spark, k) for k in REPORTED_CONF}
        spark.dataSource.register(_decoded_reader_class())
        null_sink, rows_sink = _sink_classes()
        spark.dataSource.register(null_sink)
        spark.dataSource.register(rows_sink)
        t = time.perf_counter()
        for name in candidates:  # a first query per candidate starts its workers and planners
            (tmp / f"warm-{name}").mkdir()
            run_pass(spark, bootstrap, warm_topic, partitions, tmp / f"warm-{name}", name, 5000, source_extra)
        results["warm-up (first batches)"] = {"seconds": time.perf_counter() - t}
        for name in candidates:
            runs = []
            try:
                for i in range(passes):
                    (tmp / f"{name}-{i}").mkdir()
                    runs.append(measured(run_pass, spark, bootstrap, topic, partitions, tmp / f"{name}-{i}", name,
                                         records, source_extra))
                    print(f"  [{jit}] {name} pass {i}: {runs[-1]['seconds']:.1f} s", flush=True)
            except Exception as exc:  # noqa: BLE001 - a candidate that fails is reported, the others still run
                results[name] = {"error": str(exc).splitlines()[0][:300]}
                print(f"  [{jit}] {name} failed: {results[name]['error']}", flush=True)
                continue
            best = best_of(runs)
            best["pass_detail"] = [{**d, **{k: r.get(k) for k in ("spark", "python", "table_rows", "distinct_ids")}}
                                   for d, r in zip(best["pass_detail"], runs)]
            results[name] = best
        spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


# ------------------------------------------------------------------------------------------------------ main

def add_rates(results: dict[str, Any], raw_rate: float | None, fused_rate: float | None) -> None:
    for r in results.values():
        if r.get("records") and r.get("seconds"):
            r["records_per_s"] = r["records"] / r["seconds"]
            if r.get("batch_seconds"):
                r["records_per_s_in_batches"] = r["records"] / r["batch_seconds"]
            r["x_raw"] = r["records_per_s"] / raw_rate if raw_rate else None
            r["x_fused"] = r["records_per_s"] / fused_rate if fused_rate else None


def check_rows(results: dict[str, Any], expected: dict[str, int]) -> None:
    """Each Iceberg candidate's best pass left exactly the rows its transform keeps (`ok`), else says what."""
    for name, r in results.items():
        base = name.split(" ")[0]
        if "table_rows" not in r:
            continue
        want = expected[expected_kind(base)]
        problems = [] if r["table_rows"] == want else [f"{r['table_rows']} rows, expected {want}"]
        if "distinct_ids" in r and r["distinct_ids"] != r["table_rows"]:
            problems.append(f"{r['table_rows'] - r['distinct_ids']} duplicate ids")
        r["check"] = "; ".join(problems) or "ok"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--passes", type=int, default=2, help="passes per candidate; the best is reported")
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--jit", default="c1,c2", help="c1 (the product's default), c2, or both")
    ap.add_argument("--state-store", choices=sorted(STATE_STORES), default="rocksdb",
                    help="the dedupe's state store: RocksDB (off the JVM heap; what a window of keys needs) or "
                         "Spark's default, in the heap")
    ap.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting for the session's start (profiling: spark.driver.extraJavaOptions="
                         "-XX:StartFlightRecording=…, Java Flight Recorder)")
    ap.add_argument("--sql-conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark SQL setting for the session (profiling: spark.sql.execution.arrow.maxRecordsPerBatch…)")
    ap.add_argument("--source-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an option for the Handoff sources (profiling: consumeBatch=N, the rows per fetched batch)")
    add_broker_argument(ap)
    add_out_argument(ap, "dataframe_path.json")
    # Internal: one JIT setting's Spark candidates in a process of their own (its JVM takes that setting).
    ap.add_argument("--spark-part", help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    candidates = [c for c in args.candidates.split(",") if c]
    unknown = set(candidates) - set(CANDIDATES)
    if unknown:
        ap.error(f"unknown candidates {sorted(unknown)}; known: {', '.join(CANDIDATES)}")
    sql_conf = {STATE_STORE_KEY: STATE_STORES[args.state_store], **dict(kv.split("=", 1) for kv in args.sql_conf)}
    source_extra = dict(kv.split("=", 1) for kv in args.source_option)
    if args.spark_part:
        jit, out = args.spark_part.split(":", 1)
        write_json(out, run_spark_candidates(args.bootstrap, args.topic, f"{args.topic}-warmup", args.partitions,
                                             args.records, candidates, args.passes, jit, sql_conf, source_extra,
                                             dict(kv.split("=", 1) for kv in args.spark_conf)))
        return 0

    stack = contextlib.ExitStack()
    bootstrap, _kafka = stack.enter_context(broker(args.bootstrap))
    results: dict[str, Any] = {}
    session_conf: dict[str, dict[str, str | None]] = {}
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        topic = f"bench-dfp-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for name, n in ((topic, args.records), (f"{topic}-warmup", 5000)):
            admin.create_topics([NewTopic(name, args.partitions, 1)])[name].result(30)
            time.sleep(1)
            t = time.perf_counter()
            value_bytes = produce(bootstrap, name, n)
            print(f"produced {n} records ({value_bytes / 1e6:.1f} MB) to {name} in {time.perf_counter() - t:.1f} s",
                  flush=True)
        raw_consume(bootstrap, topic, args.records, args.partitions)  # the cold pass, not reported (spark/kafka/throughput.py)
        raw = best_of([measured(raw_consume, bootstrap, topic, args.records, args.partitions) for _ in range(3)])
        raw["records"] = raw["rows"]
        results["raw-consume"] = raw
        for jit in [j for j in args.jit.split(",") if j]:
            with tempfile.NamedTemporaryFile(suffix=".json") as part:
                cmd = [sys.executable, __file__, "--spark-part", f"{jit}:{part.name}", "--topic", topic,
                       "--state-store", args.state_store, *[f"--spark-conf={kv}" for kv in args.spark_conf],
                       "--bootstrap", bootstrap, "--records", str(args.records), "--partitions",
                       str(args.partitions), "--passes", str(args.passes), "--candidates", ",".join(candidates),
                       *[f"--sql-conf={kv}" for kv in args.sql_conf],
                       *[f"--source-option={kv}" for kv in args.source_option]]
                done = subprocess.run(cmd)
                if done.returncode != 0:  # the other JIT setting's results still count
                    results[f"spark [{jit}]"] = {"error": f"the {jit} process exited {done.returncode}"}
                    continue
                part_results = json.loads(Path(part.name).read_text())
                session_conf[jit] = part_results.pop("_conf", {})
                for name, r in part_results.items():
                    results[f"{name} [{jit}]"] = r
    finally:
        stack.close()
    raw_rate = results["raw-consume"]["rows"] / results["raw-consume"]["seconds"]
    fused = {jit: results.get(f"fused [{jit}]") for jit in args.jit.split(",")}
    fused = {jit: f for jit, f in fused.items() if f and "seconds" in f}
    for name, r in results.items():
        jit = name.rsplit("[", 1)[-1].rstrip("]") if name.endswith("]") else None
        f = fused.get(jit) if jit else None
        add_rates({name: r}, raw_rate, f["records"] / f["seconds"] if f else None)
    check_rows(results, expected_rows(args.records))
    doc = {"records": args.records, "partitions": args.partitions, "passes": args.passes, "sql": SQL,
           "sql_conf": sql_conf, "source_options": source_extra, "session_conf": session_conf,
           "dedupe": {"keys": [DEDUPE_KEY], "watermark": WATERMARK}, "expected_rows": expected_rows(args.records),
           **machine_facts(), "results": results}
    write_json(args.out, doc)
    report(results, args.out)
    return 0


def report(results: dict[str, Any], out: str) -> None:
    """The results table, then where each candidate's time went."""
    print_table(results, [
        ("records", 9, lambda r: r.get("records", "")), ("seconds", 8, lambda r: f"{r['seconds']:.1f}"),
        ("records/s", 10, lambda r: f"{r.get('records_per_s', 0):.0f}"),
        ("× raw", 6, lambda r: "" if r.get("x_raw") is None else f"{r['x_raw']:.2f}"),
        ("× fused", 8, lambda r: "" if r.get("x_fused") is None else f"{r['x_fused']:.2f}"),
        ("in batches/s", 13, lambda r: "" if r.get("records_per_s_in_batches") is None
         else f"{r['records_per_s_in_batches']:.0f}"),
        ("busy core-s", 12, lambda r: one_decimal(r.get("busy_core_s"))),
        ("jvm cpu-s", 10, lambda r: one_decimal((r.get("spark") or {}).get("jvm_cpu_s"))),
        ("check", 8, lambda r: r.get("check", ""))])
    print("\nwhere the time went (best pass; seconds summed over tasks; cpu = user + system of each process kind)")
    print_table({k: v for k, v in results.items() if "spark" in v}, [
        ("task run", 9, lambda r: one_decimal(r["spark"]["run_s"])),
        ("jvm cpu", 8, lambda r: one_decimal(r["spark"]["jvm_cpu_s"])),
        ("gc", 5, lambda r: one_decimal(r["spark"]["gc_s"])),
        ("shuffle MB", 11, lambda r: one_decimal(r["spark"]["shuffle_write_mb"])),
        ("src work", 9, lambda r: one_decimal(r.get("python", {}).get("source", {}).get("work_s"))),
        ("src wait", 9, lambda r: one_decimal(r.get("python", {}).get("source", {}).get("wait_s"))),
        ("wr wait", 8, lambda r: one_decimal(r.get("python", {}).get("writer", {}).get("wait_s"))),
        ("wr batches", 11, lambda r: r.get("python", {}).get("writer", {}).get("batches", "")),
        ("jvm proc", 9, lambda r: one_decimal(cpu_of(r, lambda label: label == "jvm"))),
        ("py workers", 11, lambda r: one_decimal(cpu_of(r, lambda label: "worker" in label))),
        ("broker", 7, lambda r: one_decimal(cpu_of(r, lambda label: label == "kafka broker")))])
    print(f"\nload average during the run: {os.getloadavg()} on {os.cpu_count()} CPUs; wrote {out}")


def cpu_of(r: dict[str, Any], which: Callable[[str], bool]) -> float | None:
    """CPU seconds (user + system) of the process kinds `which` picks, in the result's best pass."""
    best = next((d for d in r.get("pass_detail", []) if round(r["seconds"], 3) == d.get("seconds")), None)
    if not best or "cpu" not in best:
        return None
    return sum(v["user_s"] + v["system_s"] for label, v in best["cpu"].items() if label != "machine" and which(label))


def print_table(results: dict[str, Any], columns: list[Any]) -> None:
    """`bench_report.print_results`' table with a name column as wide as the longest name."""
    width = max(len(n) for n in results) + 1
    print(f"\n{'pipeline':<{width}}" + "".join(f" {heading:>{w}}" for heading, w, _ in columns))
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<{width}} failed: {r['error']}")
            continue
        cells = columns if "records" in r else columns[:2]
        print(f"{name:<{width}}" + "".join(f" {cell(r) if 'records' in r or i else '':>{w}}"
                                         for i, (_, w, cell) in enumerate(cells)))


if __name__ == "__main__":
    sys.exit(main())
