"""Dead letters end to end on a real broker: bad records → DLQ topic with the contract's headers; under
`halt` a streaming query fails naming the record and the fix; the driver app stops gracefully on SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer

from handoff_spark.config import AppConfig
from handoff_spark.decode.records import decode_batch
from handoff_spark.sink.dead_letters import send_dead_letters
from handoff_spark.kafka.source import OffsetRange, SourceOptions, read_range
from handoff_testbed.eventually import eventually

pytestmark = [pytest.mark.kafka]

COLUMNS = [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"}]


def app_config(kafka: Any, topic: str, tmp_path: Path, **extra: Any) -> AppConfig:
    doc = {"handoffId": "team-a/orders", "source": {"bootstrapServers": kafka.bootstrap, "topics": [topic]},
           "sink": {"kind": "iceberg", "table": "db.orders"},
           "schema": {"columns": COLUMNS, "onIncompatible": "deadLetter"}, "deadLetterTopic": f"{topic}-dlq",
           "checkpointLocation": str(tmp_path / "ck")}
    doc.update(extra)
    return AppConfig.model_validate(doc)


def consume_all(kafka: Any, topic: str, expected: int, timeout: float = 60) -> list[Any]:
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"t-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            out += [m for m in c.consume(100, timeout=1) if m.error() is None]
    finally:
        c.close()
    return out


def test_bad_records_go_to_the_dlq_topic_with_headers_and_good_ones_decode(kafka, tmp_path):
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=1)
    kafka.create_topic(f"{topic}-dlq", partitions=1)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    records = [b'{"id": 1, "name": "ok"}', b"{oops", b'{"name": "no id"}', b'{"id": "7"}', b'{"id": 2}']
    for i, v in enumerate(records):
        p.produce(topic, v, key=f"k{i}".encode(), headers=[("trace", b"t%d" % i)])
    assert p.flush(30) == 0
    cfg = app_config(kafka, topic, tmp_path)
    opts = SourceOptions.parse({"subscribe": topic, "kafka.bootstrap.servers": kafka.bootstrap})
    raw = pa.Table.from_batches(list(read_range(opts, OffsetRange(topic, 0, 0, 5))))
    table, dead = decode_batch(raw, cfg.schema_)
    assert table.column("id").to_pylist() == [1, 2] and table.column("_kafka_offset").to_pylist() == [0, 4]
    assert send_dead_letters(cfg, raw, dead) == 3
    letters = consume_all(kafka, f"{topic}-dlq", 3)
    assert len(letters) == 3
    got = []
    for m in letters:
        h = {k: v.decode() for k, v in m.headers()}
        got.append((m.key(), m.value(), h["handoff.reason"], h["handoff.source.topic"], h["handoff.source.partition"],
                    h["handoff.source.offset"], h["handoff.id"], h["trace"]))
        assert h["handoff.error"]
    assert got == [
        (b"k1", b"{oops", "unparseable", topic, "0", "1", "team-a/orders", "t1"),
        (b"k2", b'{"name": "no id"}', "missing-required", topic, "0", "2", "team-a/orders", "t2"),
        (b"k3", b'{"id": "7"}', "type-mismatch", topic, "0", "3", "team-a/orders", "t3"),
    ]


def test_halt_policy_fails_the_streaming_query_with_the_record_and_the_fix(kafka, tmp_path):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from handoff_spark.kafka.source import HandoffKafkaDataSource

    topic = f"halt-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=1)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for v in (b'{"id": 1}', b'{"id": 2.5}'):
        p.produce(topic, v)
    assert p.flush(30) == 0
    cfg = app_config(kafka, topic, tmp_path, schema={"columns": COLUMNS, "onIncompatible": "halt"})
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    spark.dataSource.register(HandoffKafkaDataSource)
    policy = cfg.schema_

    def decode_each(df: Any, _batch_id: int) -> None:
        # what every sink does on its executors, here on the driver for brevity
        decode_batch(df.toArrow(), policy)

    query = (spark.readStream.format("handoff-kafka").option("subscribe", topic)
             .option("kafka.bootstrap.servers", kafka.bootstrap).load()
             .writeStream.foreachBatch(decode_each).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    try:
        with pytest.raises(Exception) as err:
            query.awaitTermination(300)
    finally:
        spark.stop()
    message = str(err.value)
    assert f"{topic}[0]@1" in message and "'id'" in message and "onIncompatible" in message and "Fix" in message


def _fork_servers_of(pid: int) -> list[int]:
    """The driver's child processes that are its fork server (`startup.fork_server`). A thread of the driver that
    ends between the listing of its threads and the reading of its children is skipped (it has none left)."""
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    found = []
    for child in children:
        try:
            if b"handoff_spark.startup.fork_server" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
        except FileNotFoundError:
            continue
    return found


@pytest.mark.parametrize("fork_server", ["default", "off"])
def test_driver_prints_progress_serves_metrics_and_stops_gracefully_on_sigterm(kafka, tmp_path, fork_server):
    """Also the fork server through the command a user types: `handoff run` forks Spark's Python processes from one
    (a local master), `HANDOFF_FORK_SERVER=0` runs none, and a stopped driver leaves neither it nor its directory."""
    topic = f"app-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(500):
        p.produce(topic, json.dumps({"id": i}).encode(), partition=i % 2)
    assert p.flush(30) == 0
    progress = tmp_path / "progress.json"
    cfg = app_config(kafka, topic, tmp_path, triggerIntervalSeconds=1, metricsPort=0, progressFile=str(progress),
                     sparkConf={"spark.master": "local[2]"},
                     source={"bootstrapServers": kafka.bootstrap, "topics": [topic], "maxRecordsPerBatch": 200})
    config = tmp_path / "app.json"
    config.write_text(cfg.to_json())
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        # As a user's shell has it: not this test process's Spark settings (an earlier in-process session of the same
        # pytest worker set PYSPARK_PYTHON to its own fork server's launcher, which a driver takes for the user's own
        # Python and keeps).
        clean = {k: v for k, v in os.environ.items()
                 if k not in ("HANDOFF_FORK_SERVER", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "HANDOFF_FORK_SOCKET")}
        env = {**clean, "HANDOFF_FORK_SERVER": "0"} if fork_server == "off" else clean
        proc = subprocess.Popen([sys.executable, "-m", "handoff_spark", "run", "--config", str(config), "--sink", "noop"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            eventually(lambda: progress.exists() and json.loads(progress.read_text())["lagTotal"] == 0,
                       "the driver's progress at lag 0", timeout=300, interval=0.5,
                       give_up=lambda: None if proc.poll() is None else f"the driver exited with {proc.returncode}",
                       context=lambda: log.read_text()[-3000:])
            record = json.loads(progress.read_text())
            assert record["offsets"] == {topic: {"0": 250, "1": 250}} and record["lagTotal"] == 0
            port = next(int(line.split(":")[1].split("/")[0]) for line in log.read_text().splitlines()
                        if line.startswith("metrics on :"))
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            assert 'handoff_rows_total{handoff="team-a/orders"} 500.0' in metrics
            assert f'handoff_lag_records{{handoff="team-a/orders",partition="0",topic="{topic}"}} 0.0' in metrics
            servers = _fork_servers_of(proc.pid)
            assert len(servers) == (1 if fork_server == "default" else 0), servers
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(120) == 0, log.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    import tempfile

    assert not list(Path(tempfile.gettempdir()).glob(f"handoff-fork-{proc.pid}-*"))  # its directory removed
    for server in servers:
        assert not Path(f"/proc/{server}").exists() or \
            Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    text = log.read_text()
    lines = [line for line in text.splitlines() if line.startswith("batch ")]
    assert len(lines) == 3 and all(" rows in " in line for line in lines)  # 200 + 200 + 100
    assert "SIGTERM: finishing the current micro-batch, then stopping" in text
    assert "stopped" in text.splitlines()
    # no WARN line of Spark's about adaptive execution at each query's start (app.ADAPTIVE_KEY off)
    assert "spark.sql.adaptive.enabled is not supported" not in text


def test_a_dead_letter_too_big_for_the_dlq_topic_is_sent_cut_never_fails_the_batch(kafka, tmp_path):
    """The broker refuses (asynchronously) what its topic's max.message.bytes does not hold: cut to 64 KiB, and
    for a topic smaller still, to 1 KiB without the original headers. Both with the full lengths in a header."""
    from handoff_spark.sink.dead_letters import LAST_RESORT_BYTES, TRUNCATED_BYTES

    for limit, kept, omitted in ((200_000, TRUNCATED_BYTES, None), (20_000, LAST_RESORT_BYTES, b"1")):
        topic = f"big-{uuid.uuid4().hex[:6]}"
        kafka.create_topic(topic, partitions=1)
        kafka.create_topic(f"{topic}-dlq", partitions=1, config={"max.message.bytes": str(limit)})
        big = b'{"name": "' + b"x" * 500_000 + b'"}'
        p = Producer({"bootstrap.servers": kafka.bootstrap})
        p.produce(topic, big, key=b"k" * 100_000, headers=[("trace", b"t" * 30_000)])
        p.produce(topic, b'{"id": 1}')
        assert p.flush(30) == 0
        cfg = app_config(kafka, topic, tmp_path)
        opts = SourceOptions.parse({"subscribe": topic, "kafka.bootstrap.servers": kafka.bootstrap})
        raw = pa.Table.from_batches(list(read_range(opts, OffsetRange(topic, 0, 0, 2))))
        table, dead = decode_batch(raw, cfg.schema_)
        assert table.column("id").to_pylist() == [1] and [d.reason for d in dead] == ["missing-required"]
        assert send_dead_letters(cfg, raw, dead) == 1
        (m,) = consume_all(kafka, f"{topic}-dlq", 1)
        h = dict(m.headers())
        assert h["handoff.reason"] == b"missing-required" and h["handoff.source.offset"] == b"0"
        assert h["handoff.truncated"] == f"key=100000,value={len(big)}".encode()
        assert len(m.value()) == kept and m.value() == big[:kept] and m.key() == b"k" * kept
        assert h.get("handoff.headers.omitted") == omitted and ("trace" in h) == (omitted is None)
