"""What the Kafka → table benchmarks share: the records they produce and the table's columns, the raw consumer
(the ceiling every pipeline is measured against), Spark's JVM Kafka source (the baseline) with its connector jars,
and following a query to its end. Shared so the throughput, freshness, cold-start, BigQuery and replay benchmarks
measure the same data the same way; it was part of `spark/kafka/throughput.py` until the scripts moved into the
package folders."""
from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import proc_cpu

COLUMNS = [{"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamp"},
           {"name": "customer", "type": "string"}, {"name": "amount", "type": "double"},
           {"name": "region", "type": "string"}]
SPARK_KAFKA_VERSION = "4.2.0"


def spark_kafka_jars() -> list[str]:
    """spark-sql-kafka and its runtime deps, copied once into the test-bed cache (like the Kafka broker's jars)."""
    import hashlib
    import subprocess

    from handoff_testbed.paths import HACK_DIR, cache_dir

    pom = HACK_DIR / "spark-kafka" / "pom.xml"
    stamp_text = f"{SPARK_KAFKA_VERSION} {hashlib.sha256(pom.read_bytes()).hexdigest()}"
    home = cache_dir() / f"spark-kafka-{SPARK_KAFKA_VERSION}"
    stamp = home / ".stamp"
    if not (stamp.exists() and stamp.read_text() == stamp_text):
        if shutil.which("mvn") is None:
            raise RuntimeError("the jvm-* pipelines need mvn on PATH (hack/install-system-deps.sh)")
        tmp = home.with_name(home.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", "-DincludeScope=runtime",
                        f"-DoutputDirectory={tmp}"], check=True)
        shutil.rmtree(home, ignore_errors=True)
        tmp.rename(home)
        stamp.write_text(stamp_text)
    return sorted(str(p) for p in home.glob("*.jar"))


def order_value(i: int) -> bytes:
    """Record i of the benchmarks' topic: an order whose event time is i ms after 2026-01-01."""
    import datetime as dt

    ts = (dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(milliseconds=i)).isoformat(
        timespec="milliseconds")
    return json.dumps({"id": i, "ts": ts, "customer": f"c{i % 9973:05d}", "amount": round(i * 0.37 % 500, 2),
                       "region": ("eu", "us", "ap")[i % 3], "note": "x" * 60}).encode()


def produce(bootstrap: str, topic: str, records: int, value: Any = order_value) -> int:
    """Produce `value(i)` for i in range(records) as fast as the client goes; the bytes produced."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000,
                  "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000})
    total = 0
    for i in range(records):
        v = value(i)
        total += len(v)
        while True:
            try:
                p.produce(topic, v)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0
    return total


def consumer(bootstrap: str, topic: str, partitions: int, tuned: bool = True) -> Any:
    """Assigned (not subscribed) from the beginning: no group-join delay in the timings."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    # The ceiling's consumer gets the fetch sizes the handoff source reads with (librdkafka's 1 MiB per
    # partition per fetch halves a backlog read); `raw-consume (librdkafka defaults)` shows the untuned figure.
    from handoff_spark.kafka.source import READ_FETCH_DEFAULTS

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "enable.partition.eof": True,
                  **(READ_FETCH_DEFAULTS if tuned else {})})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    return c


def raw_consume(bootstrap: str, topic: str, records: int, partitions: int, tuned: bool = True) -> dict[str, Any]:
    c = consumer(bootstrap, topic, partitions, tuned)
    rows = nbytes = eof = 0
    t0 = time.perf_counter()
    while rows < records or eof < partitions:
        # Never ask for more than is left: `consume` waits its whole timeout for `num_messages`, which would add
        # up to a second of idle wait to the ceiling's time (the same fix as the source's read loop).
        for m in c.consume(num_messages=max(1, min(10000, records - rows)), timeout=1.0):
            if m.error() is None:
                rows += 1
                nbytes += len(m.value())
            else:
                eof += 1
        if rows >= records:
            break
    elapsed = time.perf_counter() - t0
    c.close()
    return {"rows": rows, "bytes": nbytes, "seconds": elapsed}


def jvm_query(spark: Any, cfg: Any, topic: str, partitions: int, sink: str, max_records: int,
               trigger_s: float | None = None) -> Any:
    """Spark's JVM Kafka source into `noop` or `handoff-iceberg` (columns mapped to the contract's raw ones);
    AvailableNow, or a processing-time trigger of `trigger_s` seconds."""
    from handoff_spark.driver.app import MIN_PARTITIONS_PER_CORE
    from handoff_spark.checkpoint import INITIAL_OFFSETS_FILE

    ck = Path(cfg.checkpoint_location)
    # The sink takes batch 0's start from the source's initial-offsets file; the JVM source does not write it.
    (ck / INITIAL_OFFSETS_FILE).parent.mkdir(parents=True, exist_ok=True)
    (ck / INITIAL_OFFSETS_FILE).write_text(json.dumps({topic: {str(p): 0 for p in range(partitions)}}))
    # Same task split as the handoff source gets by default (Spark's own minPartitions), so both sides run
    # the same number of tasks per batch.
    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", cfg.source.bootstrap_servers)
          .option("subscribe", topic).option("startingOffsets", "earliest")
          .option("kafka.isolation.level", "read_committed").option("includeHeaders", "true")
          .option("minPartitions", str(MIN_PARTITIONS_PER_CORE * spark.sparkContext.defaultParallelism)))
    if max_records:
        df = df.option("maxOffsetsPerTrigger", str(max_records))
    df = (df.load()
          .select("topic", "partition", "offset", "timestamp", "key", "value", "headers"))
    writer = df.writeStream.format("noop") if sink == "noop" else \
        df.writeStream.format("handoff-iceberg").option("config", cfg.to_json())
    writer = writer.option("checkpointLocation", str(ck))
    if trigger_s:
        return writer.trigger(processingTime=f"{trigger_s} seconds").start()
    return writer.trigger(availableNow=True).start()


def await_query(query: Any, reporter: Any, t0: float) -> float:
    """Follow an available-now query to its end, the app's progress reporter polling it as the driver does;
    seconds since `t0`. A failed query raises its error."""
    while query.isActive:
        reporter.poll(query)
        query.awaitTermination(0.5)
    elapsed = time.perf_counter() - t0
    reporter.poll(query)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return elapsed


def best_of(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest pass, with every pass's seconds: the same rule for the baselines and the pipelines."""
    best = dict(min(passes, key=lambda r: r["seconds"]))
    best["pass_seconds"] = [round(r["seconds"], 3) for r in passes]
    # Where each pass's time went, to tell a slow pass from a fast one: the CPU of every process kind, and the
    # Spark pipelines' batch and task times.
    best["pass_detail"] = [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()
                            if k in ("seconds", "batch_seconds", "task_ms", "cpu")} for r in passes]
    # The whole machine's CPU in the best pass: a pass takes at least its busy core-seconds / the machine's cores,
    # however parallel the pipeline is (the bound against the raw consumer, docs/benchmarks.md "Throughput").
    machine = best.pop("cpu", {}).get("machine", {})
    best["busy_core_s"], best["idle_core_s"] = machine.get("busy_s"), machine.get("idle_s")
    return best


def measured(run: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """`run(*args, **kwargs)`'s result with `cpu`: what each process kind used during it (proc_cpu)."""
    before, machine = proc_cpu.snapshot(), proc_cpu.machine_seconds()
    result = run(*args, **kwargs)
    result["cpu"] = proc_cpu.cpu_by_label(before, proc_cpu.snapshot())
    result["cpu"]["machine"] = {k: round(v - machine[k], 2) for k, v in proc_cpu.machine_seconds().items()}
    return result
