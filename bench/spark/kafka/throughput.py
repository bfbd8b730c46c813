"""Throughput on the same data in the same run: how much of Kafka's raw speed survives each pipeline.

Pipelines (all read the same topic from the beginning, all to completion):
  * `raw-consume`   — one confluent-kafka consumer, `consume(num_messages=10000)`, counts rows/bytes: the ceiling
                      (best of three warm passes; the first, cold pass is reported apart).
  * `naive-pyiceberg` — one process: consume → `pyarrow.json` decode → PyIceberg `append` every N records
                      (what a hand-written consumer does; no exactly-once ledger).
  * `handoff-noop`  — the Spark app (`handoff-kafka` source, AvailableNow) into Spark's `noop` sink: the source alone.
  * `handoff-iceberg` — the Spark app end to end as `handoff run` runs it: the fused path (`handoff-kafka-ranges`
                      plans/checkpoints offset ranges, the `handoff-iceberg` write task reads, decodes, writes
                      Parquet, then the ledger commit). Its tasks read with the native reader;
                      `HANDOFF_KAFKA_READER=python` in the bench's environment measures confluent-kafka's consumer.
  * `handoff-iceberg-unfused` — the same with the record source (`handoff-kafka` → Arrow → JVM → Python writer),
                      i.e. `HANDOFF_FUSED_READ=0`: what the fused path saves.
  * `jvm-noop`      — Spark's own JVM Kafka source (spark-sql-kafka-0-10) → `noop`.
  * `jvm-iceberg`   — the JVM Kafka source, its columns selected into the contract's raw columns, → `handoff-iceberg`.
The JVM pipelines need the connector jars: `hack/spark-kafka/pom.xml` copied into the cache with Maven
(no spark-sql-kafka exists for Spark 4.3 yet; the 4.2.0 connector runs on PySpark 4.3's runtime).
The naive and Spark pipelines run `--passes` times (3) and report their best pass, as the raw consumer does.
Spark session start-up is reported separately and excluded from the Spark pipelines' times; each query's own
start and stop are included in `seconds` (rows/s), and left out of `rows/s in batches` (Spark's batch durations
alone: what a running stream sustains, as it starts its query once per driver). Batches are unbounded
by default (the product default: each batch takes everything available); `--max-records-per-batch N` bounds them.
Both Spark Kafka sources split ranges the same way (`minPartitions` = 3 × Spark's cores, the handoff default).
Every pass of the raw, naive and Spark pipelines keeps, in `pass_detail`, the CPU each kind of process used during it
(user, system, minor page faults, resident memory; `bench/proc_cpu.py`) and the machine's busy, idle, I/O-wait and
steal seconds; the table shows the best pass's busy and idle core-seconds. On 2 cores every pipeline is CPU-bound,
so that is where a slow pass's time went, and a pass takes at least its busy core-seconds / 2: with the raw
consumer keeping one core busy, a pipeline needing k× its busy core-seconds reaches at most 2/k of its speed here.

Prints a table and writes bench/results/throughput.json.

    .venv/bin/python bench/spark/kafka/throughput.py [--records 1000000] [--partitions 3] [--max-records-per-batch 0] [--bootstrap HOST:PORT]
        [--pipelines raw-consume,naive-pyiceberg,handoff-noop,handoff-iceberg,handoff-iceberg-unfused,jvm-noop,jvm-iceberg]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "spark_app"))
sys.path.insert(0, str(ROOT / "hack"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_kafka import add_broker_argument, broker  # noqa: E402
from bench_report import add_out_argument, add_rates, machine_facts, one_decimal, print_results, write_json  # noqa: E402
from bench_pipelines import (COLUMNS, await_query, best_of, measured, consumer, jvm_query, produce, raw_consume,  # noqa: E402
                             spark_kafka_jars)

ALL = ("raw-consume", "naive-pyiceberg", "handoff-noop", "handoff-iceberg", "handoff-iceberg-unfused", "jvm-noop",
       "jvm-iceberg")
NAIVE_EVERY = 100_000  # the naive pipeline's append size when batches are unbounded


def naive_pyiceberg(bootstrap: str, topic: str, records: int, partitions: int, tmp: Path,
                    every: int) -> dict[str, Any]:
    import io

    import pyarrow as pa
    import pyarrow.json as pj
    from pyiceberg.catalog.sql import SqlCatalog

    from handoff_spark.decode.records import declared_arrow_schema
    from handoff_spark.config import SchemaPolicy

    catalog = SqlCatalog("naive", uri=f"sqlite:///{tmp}/naive.db", warehouse=f"file://{tmp}/naive-wh")
    catalog.create_namespace("bench")
    schema = declared_arrow_schema(SchemaPolicy.model_validate({"columns": COLUMNS}))
    parse_schema = pa.schema([f.with_nullable(True) for f in schema])
    table = catalog.create_table("bench.naive", schema=parse_schema)
    c = consumer(bootstrap, topic, partitions)
    rows = nbytes = commits = 0
    commit_s: list[float] = []
    buf: list[bytes] = []
    t0 = time.perf_counter()

    def flush() -> None:
        nonlocal commits
        data = pj.read_json(io.BytesIO(b"\n".join(buf)), parse_options=pj.ParseOptions(
            explicit_schema=parse_schema, unexpected_field_behavior="ignore"))
        t = time.perf_counter()
        table.append(data)
        commit_s.append(time.perf_counter() - t)
        commits += 1
        buf.clear()

    while rows < records:
        for m in c.consume(num_messages=max(1, min(10000, records - rows)), timeout=1.0):
            if m.error() is None:
                rows += 1
                v = m.value()
                nbytes += len(v)
                buf.append(v)
        if len(buf) >= every or (rows >= records and buf):
            flush()
    elapsed = time.perf_counter() - t0
    c.close()
    return {"rows": rows, "bytes": nbytes, "seconds": elapsed, "commits": commits,
            "commit_p50_ms": 1000 * sorted(commit_s)[len(commit_s) // 2] if commit_s else None}


def handoff(spark: Any, bootstrap: str, topic: str, tmp: Path, pipe: str, max_records: int,
            value_bytes: int, partitions: int = 3) -> dict[str, Any]:
    from handoff_spark.sink import registry as sinks
    from handoff_spark.driver.app import ProgressReporter, start_query
    from handoff_spark.config import AppConfig

    sink = pipe.split("-", 1)[1]
    jvm = pipe.startswith("jvm-")
    if jvm:
        sink = f"jvm-{sink}"

    cfg = AppConfig.model_validate({
        "handoffId": f"bench/{sink}", "source": {"bootstrapServers": bootstrap, "topics": [topic],
                                                  "maxRecordsPerBatch": max_records or None},
        "sink": {"kind": "iceberg", "catalogName": f"bench-{sink}", "table": "bench.handoff",
                 "catalogProperties": {"type": "sql", "uri": f"sqlite:///{tmp}/{sink}.db",
                                       "warehouse": f"file://{tmp}/{sink}-wh"}},
        "schema": {"columns": COLUMNS, "onIncompatible": "halt", "evolution": "none"},
        "checkpointLocation": str(tmp / f"ck-{sink}")})
    lines: list[str] = []
    reporter = ProgressReporter(cfg, None, lines.append)
    if sink != "noop" and sink != "jvm-noop":
        sinks.get(cfg.sink.kind).prepare(cfg)
    t0 = time.perf_counter()
    if jvm:
        query = jvm_query(spark, cfg, topic, partitions, sink.removeprefix("jvm-"), max_records)
    else:
        os.environ["HANDOFF_FUSED_READ"] = "0" if sink == "iceberg-unfused" else "1"
        query = start_query(spark, cfg, available_now=True, sink_format="noop" if sink == "noop" else None)
    elapsed = await_query(query, reporter, t0)
    rows = sum(r.rows for r in reporter.reports)
    commits = [float(r.commit["commit_latency_ms"]) for r in reporter.reports
               if r.commit and r.commit.get("commit_latency_ms") is not None]
    # Where the write tasks' time went (summed over tasks and batches), and Spark's own per-batch phases.
    task_ms: dict[str, float] = {}
    for r in reporter.reports:
        for k, v in ((r.commit or {}).get("task_ms") or {}).items():
            task_ms[k] = round(task_ms.get(k, 0.0) + v, 1)
    # The query's own start and stop (an AvailableNow query plans, runs, then checks for more; a running stream
    # pays them once per driver) are in `seconds`; `batch_seconds` is Spark's time in the batches alone.
    batch_s = sum(r.duration_ms for r in reporter.reports) / 1000
    return {"rows": rows, "bytes": value_bytes if rows else 0, "seconds": elapsed, "batch_seconds": batch_s,
            "rows_per_s_in_batches": rows / batch_s if batch_s else None, "batches": len(reporter.reports),
            "commit_p50_ms": sorted(commits)[len(commits) // 2] if commits else None,
            "batch_ms": [r.duration_ms for r in reporter.reports], "task_ms": task_ms}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=3)
    add_broker_argument(ap)
    ap.add_argument("--max-records-per-batch", type=int, default=0,
                    help="0 = unset, the product default: each batch takes everything available")
    ap.add_argument("--pipelines", default=",".join(ALL))
    ap.add_argument("--passes", type=int, default=3,
                    help="passes of the naive and Spark pipelines; the best is reported (as for raw-consume)")
    add_out_argument(ap, "throughput.json")
    args = ap.parse_args(argv)
    pipelines = [p for p in args.pipelines.split(",") if p]
    stack = contextlib.ExitStack()
    bootstrap, _kafka = stack.enter_context(broker(args.bootstrap))
    results: dict[str, Any] = {}
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        topic = f"bench-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
        time.sleep(1)
        t = time.perf_counter()
        value_bytes = produce(bootstrap, topic, args.records)
        print(f"produced {args.records} records ({value_bytes / 1e6:.1f} MB) in {time.perf_counter() - t:.1f} s",
              flush=True)
        tmp = Path(tempfile.mkdtemp(prefix="bench-tp-"))
        stack.callback(shutil.rmtree, tmp, True)  # the pipelines' tables and checkpoints
        if "raw-consume" in pipelines:
            # The first read of a freshly written topic pays the broker's cold path (JIT, page cache);
            # every later pipeline reads a warm broker, so the ceiling is the second pass.
            results["raw-consume (cold)"] = raw_consume(bootstrap, topic, args.records, args.partitions)
            results["raw-consume (librdkafka defaults)"] = raw_consume(bootstrap, topic, args.records,
                                                                       args.partitions, tuned=False)
            # The ceiling is the best of three warm passes: it favours the baseline, never the pipeline.
            results["raw-consume"] = best_of([measured(raw_consume, bootstrap, topic, args.records, args.partitions)
                                              for _ in range(3)])
        if "naive-pyiceberg" in pipelines:
            passes = []
            for i in range(args.passes):
                (tmp / f"naive-{i}").mkdir()
                passes.append(measured(naive_pyiceberg, bootstrap, topic, args.records, args.partitions,
                                       tmp / f"naive-{i}", args.max_records_per_batch or NAIVE_EVERY))
            results["naive-pyiceberg"] = best_of(passes)
        spark_pipes = [p for p in pipelines if p.startswith(("handoff-", "jvm-"))]
        if spark_pipes:
            from handoff_spark.driver.app import build_session
            from handoff_spark.config import AppConfig

            jars = {"spark.jars": ",".join(spark_kafka_jars())} if any(p.startswith("jvm-") for p in spark_pipes) \
                else {}
            cfg = AppConfig.model_validate({"handoffId": "bench/x", "source": {"bootstrapServers": bootstrap,
                                                                               "topics": [topic]},
                                            "sink": {"kind": "iceberg", "table": "bench.x"},
                                            "schema": {"onIncompatible": "halt"}, "checkpointLocation": str(tmp),
                                            "sparkConf": {"spark.master": os.environ.get("BENCH_MASTER", "local[2]"),
                                                          **jars}})
            t = time.perf_counter()
            spark = build_session(cfg)
            results["spark-session-start"] = {"seconds": time.perf_counter() - t}
            # Warm-up on a small topic: the first micro-batch of a session starts Python workers and imports
            # pyarrow/pyiceberg (tens of seconds on a busy machine); steady-state throughput is what we compare.
            warm = f"{topic}-warmup"
            admin.create_topics([NewTopic(warm, args.partitions, 1)])[warm].result(30)
            time.sleep(1)
            warm_bytes = produce(bootstrap, warm, 5000)
            (tmp / "warmup").mkdir()
            t = time.perf_counter()
            for pipe in spark_pipes:
                handoff(spark, bootstrap, warm, tmp / "warmup", pipe, 5000, warm_bytes, args.partitions)
            results["warm-up (first batches)"] = {"seconds": time.perf_counter() - t}
            for pipe in spark_pipes:
                passes = []
                for i in range(args.passes):
                    (tmp / f"{pipe}-{i}").mkdir()
                    passes.append(measured(handoff, spark, bootstrap, topic, tmp / f"{pipe}-{i}", pipe,
                                           args.max_records_per_batch, value_bytes, args.partitions))
                results[pipe] = best_of(passes)
            spark.stop()
    finally:
        stack.close()
    add_rates(results)
    doc = {"records": args.records, "partitions": args.partitions, "maxRecordsPerBatch": args.max_records_per_batch,
           **machine_facts(), "results": results}
    write_json(args.out, doc)
    print_results(results, [("rows", 9, lambda r: r["rows"]), ("seconds", 8, lambda r: f"{r['seconds']:.1f}"),
                            ("rows/s", 9, lambda r: f"{r.get('rows_per_s', 0):.0f}"),
                            ("MB/s", 7, lambda r: f"{r.get('mb_per_s', 0):.1f}"),
                            ("rows/s in batches", 18, lambda r: "" if r.get("rows_per_s_in_batches") is None
                             else f"{r['rows_per_s_in_batches']:.0f}"),
                            ("busy core-s", 12, lambda r: one_decimal(r.get("busy_core_s"))),
                            ("idle core-s", 12, lambda r: one_decimal(r.get("idle_core_s"))),
                            ("commit p50 ms", 14, lambda r: "" if r.get("commit_p50_ms") is None
                             else f"{r['commit_p50_ms']:.0f}")], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
