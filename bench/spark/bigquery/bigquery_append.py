"""Kafka → BigQuery, in one run on the same topic: how much of Kafka's raw speed survives each way of appending.

Pipelines:
  * `raw-consume`           — one confluent-kafka consumer counting records: the ceiling.
  * `naive-insertall-500`   — the pattern from the "25 billion events" write-up: consume, decode, legacy streaming
                              `insertAll` (`insert_rows_json`) of 500 rows, wait for the answer, repeat.
  * `naive-sync-append-500` — the same loop on the Storage Write API `_default` stream with the client library's
                              `AppendRowsStream`, one blocking `result()` per 500-row request.
  * `handoff-{arrow,proto}-{500,2000,10000}` — the Spark app end to end (`handoff-kafka` → decode →
                              `handoff-bigquery`, exactlyOnce: PENDING streams, pipelined appends, atomic batch
                              commit) with that append format and rows per request.
Reported: rows/s, and append latency p50/p99 per request (the naive loops measure each call; the Spark runs take
the per-batch p50/p99 from the sink's commit record: median of the p50s, max of the p99s). Spark session start
is excluded. Against the BigQuery emulator (test bed) unless endpoints are given; figures from the emulator say
how the client side scales, not what BigQuery itself sustains.

    .venv/bin/python bench/spark/bigquery/bigquery_append.py [--records 150000] [--naive-records 40000] [--partitions 2] [--sizes 500,2000,10000]
        [--formats arrow,proto] [--bootstrap HOST:PORT] [--rest URL --grpc HOST:PORT --project P]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
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
from bench_report import (add_out_argument, add_rates, machine_facts, one_decimal, print_results,  # noqa: E402
                          write_json)
from bench_pipelines import COLUMNS, await_query, consumer, produce, raw_consume  # noqa: E402


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def _sink(args: Any, dataset: str, table: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "bigquery", "project": args.project, "dataset": dataset, "table": table,
            "restEndpoint": args.rest, "grpcEndpoint": args.grpc, **extra}


def _cfg(args: Any, bootstrap: str, topic: str, tmp: Path, name: str, sink: dict[str, Any]) -> Any:
    from handoff_spark.config import AppConfig

    return AppConfig.model_validate({
        "handoffId": f"bench/{name}", "source": {"bootstrapServers": bootstrap, "topics": [topic],
                                                 "maxRecordsPerBatch": args.max_records_per_batch},
        "sink": sink, "schema": {"columns": COLUMNS, "onIncompatible": "halt", "evolution": "none"},
        "checkpointLocation": str(tmp / f"ck-{name}")})


def _decoded_batches(bootstrap: str, topic: str, partitions: int, records: int, size: int, cfg: Any):
    """Consume and decode `size` records at a time (what a hand-written consumer does before each insert)."""
    import pyarrow as pa

    from handoff_spark.decode.records import decode_batch
    from handoff_spark.kafka.source import ARROW_SCHEMA

    c = consumer(bootstrap, topic, partitions)
    rows = 0
    buf: list[Any] = []
    try:
        while rows < records:
            for m in c.consume(num_messages=size - len(buf), timeout=1.0):
                if m.error() is None:
                    buf.append(m)
            if len(buf) >= size or (buf and rows + len(buf) >= records):
                raw = pa.RecordBatch.from_pydict({
                    "topic": [m.topic() for m in buf], "partition": [m.partition() for m in buf],
                    "offset": [m.offset() for m in buf], "timestamp": [m.timestamp()[1] * 1000 for m in buf],
                    "key": [m.key() for m in buf], "value": [m.value() for m in buf],
                    "headers": [[] for _ in buf]}, schema=ARROW_SCHEMA)
                decoded, _ = decode_batch(raw, cfg.schema_, "json")
                rows += len(buf)
                buf = []
                yield decoded
    finally:
        c.close()


def naive(args: Any, bootstrap: str, topic: str, tmp: Path, mode: str, size: int = 500) -> dict[str, Any]:
    """One process, one request at a time, each waited for: the seed's pattern. Reads the first
    `--naive-records` records (its rate is per row; the full topic would only make the run long)."""
    from handoff_spark.bigquery import client as bigquery_client
    from handoff_spark.bigquery.sink import prepare

    dataset = f"bench_{uuid.uuid4().hex[:6]}"
    cfg = _cfg(args, bootstrap, topic, tmp, f"naive-{mode}", _sink(args, dataset, f"naive_{mode}"))
    plan = prepare(cfg)
    sink = cfg.sink
    client = bigquery_client.rest_client(sink)
    ref = bigquery_client.table_ref(sink)
    lat: list[float] = []
    rows = 0
    t0 = time.perf_counter()
    if mode == "insertall":
        table = client.get_table(ref)
        for decoded in _decoded_batches(bootstrap, topic, args.partitions, args.naive_records, size, cfg):
            docs = decoded.to_pylist()
            for d in docs:
                for k, v in d.items():
                    if hasattr(v, "isoformat"):
                        d[k] = v.isoformat()
            t = time.perf_counter()
            errors = client.insert_rows_json(table, docs, retry=None)
            lat.append((time.perf_counter() - t) * 1000)
            if errors:
                raise RuntimeError(f"insertAll errors: {errors[:3]}")
            rows += len(docs)
    else:
        from google.cloud.bigquery_storage_v1 import types, writer

        from handoff_spark.bigquery.schema import arrow_schema, conform

        schema = arrow_schema(plan.fields)
        wc = bigquery_client.write_client(sink)
        stream = f"{bigquery_client.table_path(sink)}/streams/_default"
        template = types.AppendRowsRequest(write_stream=stream)
        template.arrow_rows = types.AppendRowsRequest.ArrowData(
            writer_schema=types.ArrowSchema(serialized_schema=schema.serialize().to_pybytes()))
        appender = writer.AppendRowsStream(wc, template)
        for decoded in _decoded_batches(bootstrap, topic, args.partitions, args.naive_records, size, cfg):
            import pyarrow as pa

            decoded = decoded.append_column("_handoff_batch_id", pa.nulls(decoded.num_rows, pa.int64()))
            shaped, _ = conform(decoded, plan.fields)
            req = types.AppendRowsRequest(write_stream=stream)
            req.arrow_rows = types.AppendRowsRequest.ArrowData(rows=types.ArrowRecordBatch(
                serialized_record_batch=shaped.combine_chunks().to_batches()[0].serialize().to_pybytes(),
                row_count=shaped.num_rows))
            t = time.perf_counter()
            appender.send(req).result()  # the anti-pattern: one blocking result() per request
            lat.append((time.perf_counter() - t) * 1000)
            rows += shaped.num_rows
        appender.close()
    elapsed = time.perf_counter() - t0
    return {"rows": rows, "seconds": elapsed, "requests": len(lat), "append_p50_ms": _pct(lat, 50),
            "append_p99_ms": _pct(lat, 99)}


def handoff(spark: Any, args: Any, bootstrap: str, topic: str, tmp: Path, fmt: str, size: int,
            label: str = "") -> dict[str, Any]:
    from handoff_spark.sink import registry as sinks
    from handoff_spark.driver.app import ProgressReporter, start_query

    name = f"{label}{fmt}-{size}"  # own checkpoint and table per run
    cfg = _cfg(args, bootstrap, topic, tmp, name, _sink(args, f"bench_{uuid.uuid4().hex[:6]}", f"h_{fmt}_{size}",
                                                         appendFormat=fmt, maxRowsPerRequest=size))
    lines: list[str] = []
    reporter = ProgressReporter(cfg, None, lines.append)
    sinks.get(cfg.sink.kind).prepare(cfg)
    t0 = time.perf_counter()
    query = start_query(spark, cfg, available_now=True)
    elapsed = await_query(query, reporter, t0)
    commits = [r.commit for r in reporter.reports if r.commit]
    p50s = [c["append_latency_p50_ms"] for c in commits if c.get("append_latency_p50_ms") is not None]
    p99s = [c["append_latency_p99_ms"] for c in commits if c.get("append_latency_p99_ms") is not None]
    return {"rows": sum(r.rows for r in reporter.reports), "seconds": elapsed, "batches": len(reporter.reports),
            "requests": sum(int(c.get("append_requests") or 0) for c in commits),
            "append_p50_ms": statistics.median(p50s) if p50s else None, "append_p99_ms": max(p99s) if p99s else None,
            "commit_p50_ms": _pct([float(c["commit_latency_ms"]) for c in commits], 50)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=150_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--sizes", default="500,2000,10000")
    ap.add_argument("--formats", default="arrow,proto")
    ap.add_argument("--max-records-per-batch", type=int, default=50_000)
    ap.add_argument("--naive", default="insertall,sync-append")
    ap.add_argument("--naive-records", type=int, default=40_000)
    add_broker_argument(ap)
    ap.add_argument("--rest")
    ap.add_argument("--grpc")
    ap.add_argument("--project", default="test-project")
    add_out_argument(ap, "bigquery_append.json")
    args = ap.parse_args(argv)
    started: list[Any] = []
    stack = contextlib.ExitStack()
    results: dict[str, Any] = {}
    try:
        bootstrap, _kafka = stack.enter_context(broker(args.bootstrap))
        if not args.rest:
            from handoff_testbed.bigquery import BigQueryEmulator

            emu = BigQueryEmulator()
            emu.build()
            emu.start(Path(tempfile.mkdtemp(prefix="bench-bq-")))
            started.append(emu)
            args.rest, args.grpc, args.project = emu.rest_endpoint, emu.grpc_endpoint, emu.project
        from confluent_kafka.admin import AdminClient, NewTopic

        topic = f"bench-bq-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
        time.sleep(1)
        produce(bootstrap, topic, args.records)
        tmp = Path(tempfile.mkdtemp(prefix="bench-bq-"))
        results["raw-consume"] = raw_consume(bootstrap, topic, args.records, args.partitions)
        print(f"raw-consume done: {results['raw-consume']['seconds']:.1f}s", flush=True)
        for mode in [m for m in args.naive.split(",") if m]:
            results[f"naive-{mode}-500"] = naive(args, bootstrap, topic, tmp, mode)
            print(f"naive-{mode} done: {results[f'naive-{mode}-500']['seconds']:.1f}s", flush=True)
        from handoff_spark.driver.app import build_session
        from handoff_spark.config import AppConfig

        cfg = AppConfig.model_validate({"handoffId": "bench/x", "source": {"bootstrapServers": bootstrap, "topics": [topic]},
                                        "sink": _sink(args, "x", "x"), "schema": {"onIncompatible": "halt"},
                                        "checkpointLocation": str(tmp),
                                        "sparkConf": {"spark.master": os.environ.get("BENCH_MASTER", "local[2]")}})
        t = time.perf_counter()
        spark = build_session(cfg)
        results["spark-session-start"] = {"seconds": time.perf_counter() - t}
        # Warm-up (not reported): the first query pays Python worker start-up and imports.
        handoff(spark, args, bootstrap, topic, tmp, "arrow", 10_000, label="warmup-")
        for fmt in [f for f in args.formats.split(",") if f]:
            for size in [int(s) for s in args.sizes.split(",") if s]:
                results[f"handoff-{fmt}-{size}"] = handoff(spark, args, bootstrap, topic, tmp, fmt, size)
                print(f"handoff-{fmt}-{size} done: {results[f'handoff-{fmt}-{size}']['seconds']:.1f}s", flush=True)
        spark.stop()
    finally:
        for comp in reversed(started):
            comp.stop()
        stack.close()
    add_rates(results)
    doc = {"records": args.records, "naiveRecords": args.naive_records, "partitions": args.partitions, "maxRecordsPerBatch": args.max_records_per_batch,
           **machine_facts(), "target": "bqemulator 1.4.0 (test bed)" if started else args.rest, "results": results}
    write_json(args.out, doc)
    print_results(results, [("rows", 7, lambda r: r["rows"]), ("seconds", 8, lambda r: f"{r['seconds']:.1f}"),
                            ("rows/s", 8, lambda r: f"{r.get('rows_per_s', 0):.0f}"),
                            ("requests", 9, lambda r: r.get("requests", "")),
                            ("p50 ms", 7, lambda r: one_decimal(r.get("append_p50_ms"))),
                            ("p99 ms", 7, lambda r: one_decimal(r.get("append_p99_ms")))], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
