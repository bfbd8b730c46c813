"""Freshness of the Iceberg table under a steady stream, at 1 s and 10 s triggers.

A producer writes `--rate` records/s (event time = produce time) for `--seconds`; the Handoff app (handoff-kafka
→ handoff-iceberg, SQLite catalog, local Spark) runs with `processingTime` = the trigger. From the ledger alone:
  * `commit freshness` per commit = snapshot commit time − newest event time in it (how stale the table is
    right after a commit; between commits staleness grows by up to one trigger interval + batch time);
  * `worst-case staleness` ≈ commit freshness + the gap to the next commit, p50/p99 over commits.
The first commit (Python worker start, imports) happens before the producer starts and is excluded.
The baseline, in the same run: Spark's own JVM Kafka source (spark-sql-kafka, `--pipelines handoff,jvm`) into the
same sink with the same trigger. `--producers plain,transactional` runs the same triggers with an exactly-once (transactional) producer too,
side by side: a transactional topic's caught-up ranges end in commit markers, which the reader must not wait on.
Prints a table and writes bench/results/freshness.json.

    .venv/bin/python bench/spark/kafka/freshness.py [--triggers 1,10] [--rate 2000] [--seconds 60] [--pipelines handoff,jvm]
        [--producers plain,transactional]
        [--bootstrap HOST:PORT]
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "spark_app"))
sys.path.insert(0, str(ROOT / "hack"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_kafka import add_broker_argument, broker  # noqa: E402
from bench_report import add_out_argument, machine_facts, write_json  # noqa: E402

COLUMNS = [{"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamp", "required": True},
           {"name": "payload", "type": "string"}]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def steady_producer(bootstrap: str, topic: str, rate: int, seconds: float, stop: threading.Event,
                    produced: list[int], transactional: bool = False) -> None:
    """`rate` records/s; `transactional`: an exactly-once producer committing a transaction every ~100 ms
    (each commit leaves a marker, so every caught-up range ends in an offset that holds no record)."""
    from confluent_kafka import Producer

    conf = {"bootstrap.servers": bootstrap, "linger.ms": 5}
    if transactional:
        conf["transactional.id"] = f"bench-{topic}"
    p = Producer(conf)
    if transactional:
        p.init_transactions(30)
        p.begin_transaction()
    t0 = last_commit = time.monotonic()
    i = 0
    while not stop.is_set() and time.monotonic() - t0 < seconds:
        due = int((time.monotonic() - t0) * rate)
        while i < due:
            now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
            p.produce(topic, json.dumps({"id": i, "ts": now, "payload": "x" * 100}).encode())
            i += 1
        p.poll(0)
        if transactional and time.monotonic() - last_commit >= 0.1:
            p.commit_transaction(30)
            p.begin_transaction()
            last_commit = time.monotonic()
        time.sleep(0.01)
    if transactional:
        p.commit_transaction(30)
    p.flush(30)
    produced.append(i)


def run_trigger(spark: Any, bootstrap: str, trigger_s: float, rate: int, seconds: float, tmp: Path,
                producer_kind: str = "plain", pipeline: str = "handoff") -> dict[str, Any]:
    from handoff_spark.iceberg import ledger
    from handoff_spark.sink import registry as sinks
    from handoff_spark.driver.app import start_query
    from handoff_spark.config import AppConfig

    topic = f"fresh-{uuid.uuid4().hex[:6]}"
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    run = f"{trigger_s}-{producer_kind}-{pipeline}"
    props = {"type": "sql", "uri": f"sqlite:///{tmp}/fresh-{run}.db", "warehouse": f"file://{tmp}/wh-{run}"}
    cfg = AppConfig.model_validate({
        "handoffId": f"bench/fresh-{trigger_s}", "source": {"bootstrapServers": bootstrap, "topics": [topic]},
        "sink": {"kind": "iceberg", "catalogName": f"fresh-{run}", "table": "bench.fresh",
                 "catalogProperties": props},
        "schema": {"columns": COLUMNS, "onIncompatible": "halt", "eventTimeColumn": "ts"},
        "triggerIntervalSeconds": trigger_s, "checkpointLocation": str(tmp / f"ck-{run}")})
    sinks.get(cfg.sink.kind).prepare(cfg)
    from confluent_kafka import Producer

    warm = Producer({"bootstrap.servers": bootstrap})
    warm.produce(topic, json.dumps({"id": -1, "ts": dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")}).encode())
    warm.flush(30)
    if pipeline == "jvm":
        from bench_pipelines import jvm_query

        query = jvm_query(spark, cfg, topic, 3, "iceberg", 0, trigger_s)
    else:
        query = start_query(spark, cfg)

    def committed_rows() -> int:
        if not query.isActive:
            raise RuntimeError(f"the query stopped: {query.exception()}")
        try:
            table = ledger.load_table(f"fresh-{run}", props, "bench.fresh")
        except Exception:  # noqa: BLE001 - not yet created
            return 0
        return sum(c.rows for c in ledger.list_commits(table, cfg.handoff_id))

    deadline = time.monotonic() + 600
    while committed_rows() < 1 and time.monotonic() < deadline:  # first batch = warm-up, not measured
        time.sleep(1)
    started_ms = int(time.time() * 1000)
    stop = threading.Event()
    produced: list[int] = []
    producer = threading.Thread(target=steady_producer, args=(bootstrap, topic, rate, seconds, stop, produced,
                                                                    producer_kind == "transactional"),
                                daemon=True)
    producer.start()
    producer.join()
    expected = 1 + produced[0]
    deadline = time.monotonic() + 300
    while committed_rows() < expected and time.monotonic() < deadline:
        time.sleep(1)
    query.stop()
    table = ledger.load_table(f"fresh-{run}", props, "bench.fresh")
    commits = sorted((c for c in ledger.list_commits(table, cfg.handoff_id)
                      if c.rows and c.max_event_time_ms and c.max_event_time_ms >= started_ms),
                     key=lambda c: c.timestamp_ms)
    fresh = [(c.timestamp_ms - c.max_event_time_ms) / 1000 for c in commits]
    worst = [(n.timestamp_ms - c.max_event_time_ms) / 1000 for c, n in zip(commits, commits[1:])]
    return {"pipeline": pipeline, "trigger_s": trigger_s, "producer": producer_kind, "rate": rate, "seconds": seconds, "commits": len(commits),
            "rows": sum(c.rows for c in commits),
            "commit_freshness_p50_s": pct(fresh, 0.5), "commit_freshness_p99_s": pct(fresh, 0.99),
            "worst_staleness_p50_s": pct(worst, 0.5), "worst_staleness_p99_s": pct(worst, 0.99)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--triggers", default="1,10")
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--pipelines", default="handoff,jvm",
                    help="handoff (the app as it runs) and/or jvm (Spark's JVM Kafka source into the same sink)")
    ap.add_argument("--producers", default="plain",
                    help="comma-separated: plain, transactional (exactly-once producer, a commit every ~100 ms)")
    add_broker_argument(ap)
    add_out_argument(ap, "freshness.json")
    args = ap.parse_args(argv)
    stack = contextlib.ExitStack()
    bootstrap, _kafka = stack.enter_context(broker(args.bootstrap))
    results = []
    try:
        from handoff_spark.driver.app import build_session
        from handoff_spark.config import AppConfig

        pipelines = [p for p in args.pipelines.split(",") if p]
        jars: dict[str, str] = {}
        if "jvm" in pipelines:
            from bench_pipelines import spark_kafka_jars

            jars = {"spark.jars": ",".join(spark_kafka_jars())}
        tmp = Path(tempfile.mkdtemp(prefix="bench-fresh-"))
        cfg = AppConfig.model_validate({"handoffId": "bench/x", "source": {"bootstrapServers": bootstrap,
                                                                           "topics": ["x"]},
                                        "sink": {"kind": "iceberg", "table": "bench.x"},
                                        "schema": {"onIncompatible": "halt"}, "checkpointLocation": str(tmp),
                                        "sparkConf": {"spark.master": os.environ.get("BENCH_MASTER", "local[2]"),
                                                      **jars}})
        spark = build_session(cfg)
        for kind in args.producers.split(","):
            for trig in [float(t) for t in args.triggers.split(",")]:
                for pipe in pipelines:
                    results.append(run_trigger(spark, bootstrap, trig, args.rate, args.seconds, tmp, kind, pipe))
                    print(json.dumps(results[-1]), flush=True)
        spark.stop()
    finally:
        stack.close()
    write_json(args.out, {**machine_facts(), "results": results})
    print(f"\n{'pipeline':>8} {'producer':>13} {'trigger':>8} {'commits':>8} {'rows':>8} {'fresh p50':>10} {'fresh p99':>10} {'worst p50':>10} "
          f"{'worst p99':>10}")
    f = lambda v: "" if v is None else f"{v:.2f}"  # noqa: E731
    for r in results:
        print(f"{r['pipeline']:>8} {r['producer']:>13} {r['trigger_s']:>7.0f}s {r['commits']:>8} {r['rows']:>8} {f(r['commit_freshness_p50_s']):>10} "
              f"{f(r['commit_freshness_p99_s']):>10} {f(r['worst_staleness_p50_s']):>10} "
              f"{f(r['worst_staleness_p99_s']):>10}")
    print(f"\nload average: {os.getloadavg()} on {os.cpu_count()} CPUs; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
