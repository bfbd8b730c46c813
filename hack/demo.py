"""`make demo`: a Kafka topic handed off to an Iceberg table through Spark, exactly once, through a crash.

What it shows, on one machine with nothing but the repo's .venv and Java:
1. a real Apache Kafka broker (the test bed's KRaft node) with an `orders` topic: orders, some of them test
   orders, some order ids sent twice, some orders arriving hours late, a few malformed records;
2. a StreamTableHandoff manifest run by `handoff run` (the operator's own rendering of the app config,
   then the Spark Structured Streaming app in local mode) into an Iceberg table (SQLite catalog), with a SQL
   transform (a filter, a derived column, a cast), a dedupe on the order id and event time, all run by Spark:
   every batch is Spark's query's;
3. the driver killed with SIGKILL in the middle of the stream, more orders produced while it is down,
   then restarted from its checkpoint;
4. a ReplayRequest (`handoff replay`, the operator's plan and steps run locally): the table rolled back three
   snapshots, the driver restarted, and the table whole again (the same rows, none twice);
5. the proof: every order that passes the transform is in the table exactly once (row count == distinct
   (partition, offset) == distinct order ids == expected), the duplicates and test orders were dropped and
   counted in the ledger, late and malformed records went to the dead-letter topic with their reasons, and each
   table snapshot names the exact Kafka offsets it holds (the ledger the operator reads for replay).

Why this scenario: it is the product's promise (exactly once across failures) made observable in about
two minutes. Exit code 0 only if every check holds.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from handoff_testbed.kafka import Kafka  # noqa: E402
from handoff_testbed.process_tree import kill_tree  # noqa: E402

TOPIC = "orders"
DLQ_TOPIC = "orders.dlq"
TABLE = "shop.orders"
HANDOFF_ID = "demo/orders-to-iceberg"
BAD_RECORDS = [
    b"{not json",                                                       # unparseable
    b'{"customer_id": 7, "status": "new", "total": 1.5, "created_at": "2026-01-01T00:00:00Z"}',  # no order_id
    b'{"order_id": "x-1", "customer_id": "seven", "created_at": "2026-01-01T00:00:00Z"}',      # type mismatch
]


def say(text: str = "") -> None:
    print(text, flush=True)


def step(text: str) -> None:
    say(f"\n==> {text}")


MANIFEST = """\
apiVersion: handoff.io/v1alpha1
kind: StreamTableHandoff
metadata:
  name: orders-to-iceberg
  namespace: demo
spec:
  source:
    bootstrapServers: {bootstrap}
    topics: [{topic}]
    startingOffsets: earliest
    format: json
    maxRecordsPerBatch: {batch}
  sink:
    iceberg:
      catalog:
        name: demo
        properties:
          type: sql
          uri: sqlite:///{workdir}/catalog.db
          warehouse: file://{workdir}/warehouse
      table: {table}
      partitionBy: ["day(created_at)"]
  schema:
    columns:
      - {{name: order_id, type: string, required: true}}
      - {{name: customer_id, type: long, required: true}}
      - {{name: status, type: string}}
      - {{name: total, type: "decimal(12,2)"}}
      - {{name: created_at, type: timestamp, required: true}}
    onIncompatible: deadLetter
  transform:
    sql: >-
      SELECT order_id, customer_id, upper(status) AS status, total,
      CAST(round(total * 1.2, 2) AS DECIMAL(12,2)) AS total_with_vat, created_at,
      _kafka_topic, _kafka_partition, _kafka_offset, _kafka_timestamp
      FROM source WHERE status <> 'test'
  dedupe:
    keys: [order_id]
    within: 10m
  eventTime:
    column: created_at
    watermark: 1m
  deadLetter:
    topic: {dlq}
  commitInterval: 2s
  spark:
    sparkConf:
      spark.sql.shuffle.partitions: "2"
"""


#: Every TEST_EVERY-th order is a test order (the transform filters it out); every DUP_EVERY-th order is sent
#: again a little later (the dedupe drops the second copy).
TEST_EVERY, DUP_EVERY = 50, 97
LATE_ORDERS = 20  # orders whose event time is two hours old when they arrive: dead letters, reason `late`


def _order(i: int, rng: random.Random, at: float, status: str | None = None) -> dict:
    return {"order_id": f"o-{i:07d}", "customer_id": rng.randint(1, 500),
            "status": status or ("test" if i % TEST_EVERY == 0 else rng.choice(["new", "paid", "shipped"])),
            "total": f"{rng.uniform(1, 500):.2f}",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}Z"}


def produce_orders(bootstrap: str, start: int, count: int, bad: list[bytes] = (), late: int = 0) -> dict[str, int]:
    """Produce orders `start`…`start+count-1` (with the test orders and re-sent ids above), `late` late orders
    first and `bad` malformed records; return what was produced, by kind."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    rng = random.Random(start)
    for raw in bad:
        producer.produce(TOPIC, value=raw, key=b"bad")
    for j in range(late):
        order = _order(9_000_000 + start + j, rng, time.time() - 7200, status="paid")
        producer.produce(TOPIC, key=order["order_id"].encode(), value=json.dumps(order).encode())
    counts = {"orders": 0, "tests": 0, "resent": 0, "late": late}
    for i in range(start, start + count):
        # The event time is when the order is produced, as in a shop, so the freshness the driver prints (now
        # minus the newest committed event time) is the real delay from order to table.
        order = _order(i, rng, time.time())
        producer.produce(TOPIC, key=order["order_id"].encode(), value=json.dumps(order).encode())
        counts["orders"] += 1
        counts["tests"] += order["status"] == "test"
        if i % DUP_EVERY == 0 and order["status"] != "test":
            again = dict(order, status="paid", created_at=_order(i, rng, time.time() + 1)["created_at"])
            producer.produce(TOPIC, key=order["order_id"].encode(), value=json.dumps(again).encode())
            counts["resent"] += 1
        if i % 5000 == 0:
            producer.poll(0)
    remaining = producer.flush(60)
    if remaining:
        raise SystemExit(f"{remaining} records not delivered")
    return counts


class Driver:
    """The Spark app (`python -m handoff_spark run --config app.json`) as a child process group: the
    Python driver, its Spark JVM and the Python workers, so kill -9 takes them all like a node loss."""

    def __init__(self, app_config: Path, log: Path) -> None:
        self.app_config, self.log = app_config, log
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        env = dict(os.environ, HANDOFF_SPARK_LOG_LEVEL="ERROR")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "handoff_spark", "run", "--config", str(self.app_config)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        """Everything to the log file; the per-batch progress lines also to the console."""
        assert proc.stdout is not None
        with open(self.log, "a") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if line.startswith(("batch ", "seed batch ", "SIGTERM", "SIGINT", "second ",
                                    "the transform failed")):
                    say(f"    driver | {line.rstrip()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        kill_tree(self.proc.pid)  # the driver, its JVM and its Python workers, as a pod dies
        self.proc.wait()

    def stop(self, timeout: float = 120) -> int:
        """SIGTERM to the driver process only = the app's graceful stop (finish the batch, exit 0);
        signalling the whole group would also stop the JVM under it."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()


REPLAY = """\
apiVersion: handoff.io/v1alpha1
kind: ReplayRequest
metadata:
  name: last-three
  namespace: demo
spec:
  handoffRef:
    name: orders-to-iceberg
  mode: RollbackAndReplay
  target:
    snapshotId: {snapshot}     # the 4th newest commit: the 3 after it are discarded and re-read
"""


def _table(catalog_props: dict[str, str]):
    from handoff_spark.iceberg import ledger
    from handoff_spark.iceberg.table import forget_catalog

    forget_catalog("demo", catalog_props)
    return ledger.load_table("demo", catalog_props, TABLE)


def table_rows(catalog_props: dict[str, str]) -> list[tuple[int, int, str]]:
    """(partition, offset, order id) of every row, sorted: two equal lists are the same table content."""
    data = _table(catalog_props).scan(selected_fields=("order_id", "_kafka_partition", "_kafka_offset")).to_arrow()
    return sorted(zip(data["_kafka_partition"].to_pylist(), data["_kafka_offset"].to_pylist(),
                      data["order_id"].to_pylist()))


def commit_ids(catalog_props: dict[str, str]) -> list[int]:
    """Snapshot ids of the handoff's micro-batch commits, newest first."""
    from handoff_spark.iceberg import ledger

    return [c.snapshot_id for c in ledger.list_commits(_table(catalog_props), HANDOFF_ID, include_markers=False)]


def committed_rows(catalog_props: dict[str, str]) -> int:
    """Rows recorded by the ledger along the table's current ancestry (0 before the first commit)."""
    from handoff_spark.iceberg import ledger
    from handoff_spark.iceberg.table import forget_catalog

    forget_catalog("demo", catalog_props)
    try:
        table = ledger.load_table("demo", catalog_props, TABLE)
    except Exception:  # noqa: BLE001 - table not created yet
        return 0
    return sum(c.rows for c in ledger.list_commits(table, HANDOFF_ID))


def wait_for(predicate, timeout: float, what: str, driver: Driver) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if not driver.alive():
            raise SystemExit(f"the driver exited while waiting for {what}; see {driver.log}")
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}; see {driver.log}")


def dlq_sources(bootstrap: str) -> tuple[int, dict[tuple[str, str], str]]:
    """(deliveries, {distinct source partition/offset: reason}) in the dead-letter topic."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo-dlq-reader",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    _, high = consumer.get_watermark_offsets(TopicPartition(DLQ_TOPIC, 0), timeout=10)
    consumer.assign([TopicPartition(DLQ_TOPIC, 0, 0)])
    seen: dict[tuple[str, str], str] = {}
    deliveries = 0
    deadline = time.monotonic() + 30
    while deliveries < high and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None or msg.error():
            continue
        deliveries += 1
        headers = dict((k, v.decode()) for k, v in (msg.headers() or []))
        seen[(headers.get("handoff.source.partition", "?"), headers.get("handoff.source.offset", "?"))] = \
            headers.get("handoff.reason", "?")
    consumer.close()
    return deliveries, seen


def verify(kafka: Kafka, catalog_props: dict[str, str], app_config: dict, total: int,
           produced: dict[str, int]) -> dict[str, bool]:
    """Compare the table, its ledger, the DLQ and the consumer group with what Kafka holds."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import OffsetSpec
    from handoff_spark.iceberg import ledger
    from handoff_spark.iceberg.table import forget_catalog

    forget_catalog("demo", catalog_props)
    table = ledger.load_table("demo", catalog_props, TABLE)
    data = table.scan(selected_fields=("order_id", "_kafka_partition", "_kafka_offset")).to_arrow()
    distinct_offsets = len(set(zip(data["_kafka_partition"].to_pylist(), data["_kafka_offset"].to_pylist())))
    distinct_orders = len(set(data["order_id"].to_pylist()))
    commits = ledger.list_commits(table, HANDOFF_ID)
    deliveries, bad_sources = dlq_sources(kafka.bootstrap)
    admin = kafka.admin()
    group = app_config["source"].get("consumerGroup") or f"handoff-{HANDOFF_ID.replace('/', '.')}"
    tps = [TopicPartition(TOPIC, p) for p in range(3)]
    ends = {tp.partition: admin.list_offsets({tp: OffsetSpec.latest()})[tp].result(30).offset for tp in tps}
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, tps)])[group].result(30)
    group_offsets = {tp.partition: tp.offset for tp in listed.topic_partitions}
    ledger_ends = commits[0].end_offsets.get(TOPIC, {}) if commits else {}

    dropped = sum(int(table.snapshot_by_id(c.snapshot_id).summary.additional_properties.get("handoff.dropped-rows", 0))
                  for c in commits if c.kind == "batch")
    late = sum(1 for reason in bad_sources.values() if reason == "late")
    statuses = set(table.scan(selected_fields=("status",)).to_arrow()["status"].to_pylist())
    say(f"    orders produced                  {produced['orders']:>8,}  (+{produced['resent']} sent twice, "
        f"{produced['late']} late, {len(BAD_RECORDS)} malformed)")
    say(f"    expected in the table            {total:>8,}  (orders − {produced['tests']} test orders)")
    say(f"    table rows                       {data.num_rows:>8,}")
    say(f"    distinct (partition, offset)     {distinct_offsets:>8,}")
    say(f"    distinct order ids               {distinct_orders:>8,}")
    say(f"    dead letters (distinct/sent)     {len(bad_sources):>8,} / {deliveries}  ({late} late)")
    say(f"    dropped by the transform/dedupe  {dropped:>8,}  (ledger handoff.dropped-rows)")
    say(f"    ledger commits (snapshots)       {len(commits):>8,}")
    say(f"    Kafka end offsets                {ends}")
    say(f"    ledger end offsets (newest)      {ledger_ends}")
    say(f"    consumer group offsets           {group_offsets}   ({group})")
    say("    newest commits (batch id: offsets [start, end) per partition):")
    for c in commits[:3]:
        say(f"      batch {c.batch_id:>3}: rows={c.rows:<6} {c.offsets.get(TOPIC, {})}")
    return {
        "every valid record is in the table": data.num_rows == total,
        "no record twice (distinct offsets == rows)": distinct_offsets == data.num_rows,
        "no order twice": distinct_orders == total,
        "malformed and late records in the dead-letter topic":
            len(bad_sources) == len(BAD_RECORDS) + produced["late"] and late == produced["late"],
        "test orders filtered and re-sent ids dropped, counted in the ledger":
            dropped == produced["tests"] + produced["resent"] and "TEST" not in statuses,
        "every batch committed by Spark's query (none by the driver itself)":
            all(not (c.query_id or "").startswith("bootstrap-") for c in commits),
        "ledger ends at Kafka's end offsets": ledger_ends == ends,
        "group offsets == ledger (committed after the table)": group_offsets == ends,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=24_000, help="orders before the crash (default 24000)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, table, checkpoint)")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="handoff-demo-"))
    catalog_props = {"type": "sql", "uri": f"sqlite:///{workdir}/catalog.db",
                     "warehouse": f"file://{workdir}/warehouse"}
    kafka = Kafka()
    driver: Driver | None = None
    ok = False
    t_start = time.monotonic()
    try:
        step(f"Starting Apache Kafka {kafka.version} (KRaft, one node) from the official jars")
        kafka.build()
        kafka.start(workdir / "kafka")
        say(f"    broker on {kafka.bootstrap}, ready in {kafka.startup_seconds:.1f} s")
        kafka.create_topic(TOPIC, partitions=3)
        kafka.create_topic(DLQ_TOPIC, partitions=1)

        wave1, wave2 = args.records, args.records // 2
        step(f"Producing {wave1:,} orders (+{len(BAD_RECORDS)} malformed records; every {TEST_EVERY}th a test order, "
             f"every {DUP_EVERY}th sent twice) to '{TOPIC}' (3 partitions)")
        produced = produce_orders(kafka.bootstrap, 0, wave1, bad=BAD_RECORDS)

        manifest = workdir / "orders-to-iceberg.yaml"
        manifest.write_text(MANIFEST.format(bootstrap=kafka.bootstrap, topic=TOPIC, dlq=DLQ_TOPIC, table=TABLE,
                                            workdir=workdir, batch=max(1000, wave1 // 8)))
        step("The StreamTableHandoff (what you would `kubectl apply`):")
        for line in manifest.read_text().splitlines():
            say(f"    {line}")

        step("Rendering the app config as the operator does, then starting the Spark app (local[2])")
        say("    handoff run -f orders-to-iceberg.yaml --metrics-port 0 --print-config > app.json")
        say("    python -m handoff_spark run --config app.json        # micro-batches every 2 s")
        app_json = workdir / "app.json"
        rendered = subprocess.run(
            [sys.executable, "-m", "handoff_operator", "run", "-f", str(manifest), "--print-config",
             "--checkpoint", str(workdir / "checkpoint"), "--master", "local[2]",
             # any free port for the driver's metrics: 9090 (the pods' port) is Prometheus's own default, so a
             # newcomer's machine may well have it taken
             "--metrics-port", "0"],
            capture_output=True, text=True)
        if rendered.returncode != 0:
            raise SystemExit(f"handoff run --print-config failed:\n{rendered.stdout}{rendered.stderr}")
        app_json.write_text(rendered.stdout)
        driver = Driver(app_json, workdir / "driver.log")
        driver.start()
        wait_for(lambda: committed_rows(catalog_props) >= wave1 // 4, 300, "the first commits", driver)
        at_kill = committed_rows(catalog_props)
        step(f"kill -9 the driver mid-stream ({at_kill:,} of {wave1:,} rows committed so far)")
        driver.kill9()

        step(f"Producing {wave2:,} more orders while the driver is down, and {LATE_ORDERS} orders two hours late")
        for kind, n in produce_orders(kafka.bootstrap, wave1, wave2, late=LATE_ORDERS).items():
            produced[kind] += n

        step("Restarting the driver from its checkpoint (a batch already in the table is skipped, never re-applied)")
        driver.start()
        total = produced["orders"] - produced["tests"]
        wait_for(lambda: committed_rows(catalog_props) >= total, 600, f"{total:,} committed rows", driver)
        step("Graceful stop (SIGTERM: finish the batch, commit, exit 0)")
        rc = driver.stop()
        say(f"    driver exited with {rc}")

        before = table_rows(catalog_props)
        commits = commit_ids(catalog_props)
        step("ReplayRequest: roll the table back 3 snapshots and re-read them from Kafka (RollbackAndReplay)")
        replay_yaml = workdir / "replay.yaml"
        replay_yaml.write_text(REPLAY.format(snapshot=commits[3]))
        for line in replay_yaml.read_text().splitlines():
            say(f"    {line}")
        say("    handoff replay -f orders-to-iceberg.yaml -r replay.yaml   # the operator's plan and steps, locally")
        replayed = subprocess.run(
            [sys.executable, "-m", "handoff_operator", "replay", "-f", str(manifest), "-r", str(replay_yaml),
             "--checkpoint", str(workdir / "checkpoint")], capture_output=True, text=True)
        for line in (replayed.stdout + replayed.stderr).splitlines():
            say(f"    replay | {line}")
        rolled_back = len(table_rows(catalog_props))
        say(f"    table rows now {rolled_back:,} (were {len(before):,})")
        step("Starting the driver again: its checkpoint disagrees with the ledger, so it resumes from the ledger "
             "(seed batches first: the dedupe's window rebuilt from Kafka, nothing written)")
        driver.start()
        wait_for(lambda: committed_rows(catalog_props) >= total, 600, "the replay", driver)
        rc_replay = driver.stop()
        after = table_rows(catalog_props)
        say(f"    table rows after the replay {len(after):,}; driver exited with {rc_replay}")

        step("Checking the table against Kafka")
        checks = verify(kafka, catalog_props, json.loads(app_json.read_text()), total, produced)
        checks["graceful stop exited 0"] = rc == 0 and rc_replay == 0
        checks["replay: rolled back, then the table is whole again (same rows, none twice)"] = (
            replayed.returncode == 0 and rolled_back < len(before) and after == before)
        step("Result")
        for name, passed in checks.items():
            say(f"    [{'ok' if passed else 'FAILED'}] {name}")
        ok = all(checks.values())
        say(f"\n{'Through Spark, exactly once, through a kill -9 and a replay.' if ok else 'Some checks FAILED.'} "
            f"({time.monotonic() - t_start:.0f} s)")
        return 0 if ok else 1
    finally:
        if driver is not None and driver.alive():
            driver.stop(timeout=30)
        kafka.stop()
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"work directory kept: {workdir} (driver.log, kafka/kafka.log, warehouse/, checkpoint/)")


if __name__ == "__main__":
    sys.exit(main())
