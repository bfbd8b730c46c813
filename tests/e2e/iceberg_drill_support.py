"""Shared machinery of the Iceberg exactly-once drills: produce to the real broker, run the app as a
subprocess in its own session (so kill -9 takes all of it), and the invariants every drill ends with."""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from confluent_kafka import Consumer, Producer, TopicPartition

from handoff_spark.iceberg import ledger, maintenance
from handoff_spark.config import AppConfig
from handoff_spark.iceberg.sink import open_table
from handoff_testbed.process_tree import kill_tree
from handoff_testbed.tcp_forward import start_relay

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable


def drill_config(tmp_path: Path, bootstrap: str, topic: str, *, catalog: dict[str, str] | None = None,
                 max_records: int = 400, columns: list[dict[str, Any]] | None = None,
                 schema: dict[str, Any] | None = None, **overrides: Any) -> AppConfig:
    doc: dict[str, Any] = {
        "handoffId": "drills/" + topic,
        "source": {"bootstrapServers": bootstrap, "topics": [topic], "maxRecordsPerBatch": max_records},
        "sink": {"kind": "iceberg", "catalogName": "drill",
                 "catalogProperties": catalog or {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                                                  "warehouse": f"file://{tmp_path}/warehouse"},
                 "table": "drills.t_" + topic.replace("-", "_"), "partitionBy": ["day(ts)", "bucket(4, id)"],
                 "commitRetries": 3},
        "schema": schema or {"columns": columns or [{"name": "id", "type": "long", "required": True},
                                                    {"name": "ts", "type": "timestamp"},
                                                    {"name": "region", "type": "string"}],
                             "onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path / "checkpoint"),
        "maintenance": {"orphanMinAgeSeconds": 0, "everyBatches": 5, "expireOlderThanSeconds": 3600},
    }
    doc.update(overrides)
    cfg = AppConfig.model_validate(doc)
    (tmp_path / "app.json").write_text(cfg.to_json())
    return cfg


def value(i: int, **extra: Any) -> bytes:
    ts = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=37 * i)
    return json.dumps({"id": i, "ts": ts.isoformat(), "region": ["eu", "us", "ap"][i % 3], **extra}).encode()


def produce(bootstrap: str, topic: str, ids: range, **extra: Any) -> int:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in ids:
        p.produce(topic, key=str(i).encode(), value=value(i, **extra))
    assert p.flush(30) == 0
    return len(ids)


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "drill-probe"})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions}
    finally:
        c.close()


@dataclass
class Run:
    returncode: int
    log: Path


def run_app(tmp_path: Path, env: dict[str, str] | None = None, timeout: float = 300,
            kill_after_commits: int | None = None, cfg: AppConfig | None = None,
            on_commits: tuple[int, Callable[[], None]] | None = None) -> Run:
    """One app run. `kill_after_commits`: kill -9 the app's process group once the table holds that many
    ledger commits (a kill at whatever point the app is then in — usually mid-batch). `on_commits=(n, fn)`:
    call fn once when the table holds n commits (broker restart, catalog outage …) while the app runs."""
    n = len(list((tmp_path).glob("app-*.log")))
    log = tmp_path / f"app-{n}.log"
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "spark_app"), str(REPO / "hack")]),
                "PYSPARK_PYTHON": PY, "PYSPARK_DRIVER_PYTHON": PY,
                **(env or {})}
    with log.open("w") as fh:
        # the real driver entry point, as the operator runs it (AvailableNow: exits once all is committed)
        proc = subprocess.Popen([PY, "-m", "handoff_spark", "run", "--config", str(tmp_path / "app.json"),
                                 "--available-now"], stdout=fh, stderr=subprocess.STDOUT,
                                env=full_env, start_new_session=True, cwd=tmp_path)
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"app did not finish in {timeout}s; see {log}")
                if on_commits is not None and cfg is not None and _commits(cfg) >= on_commits[0]:
                    on_commits[1]()
                    on_commits = None
                if kill_after_commits is not None and cfg is not None and _commits(cfg) >= kill_after_commits:
                    kill_tree(proc.pid)  # every process, as a pod dies
                    proc.wait()
                    break
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.wait()
    return Run(proc.returncode, log)


def _commits(cfg: AppConfig) -> int:
    try:
        return len(ledger.list_commits(open_table(cfg, create=False)))
    except Exception:  # noqa: BLE001 - table not there yet / catalog busy
        return 0


def run_to_completion(tmp_path: Path, max_runs: int = 4, **kw: Any) -> list[Run]:
    """Run the app again until it exits 0 (each restart must resume exactly once)."""
    runs = []
    for _ in range(max_runs):
        r = run_app(tmp_path, **kw)
        runs.append(r)
        if r.returncode == 0:
            return runs
        kw.pop("env", None)
        kw.pop("kill_after_commits", None)
        kw.pop("on_commits", None)
    raise AssertionError(f"app never finished cleanly: {[(r.returncode, str(r.log)) for r in runs]}\n"
                         + runs[-1].log.read_text()[-4000:])


def assert_exactly_once(cfg: AppConfig, bootstrap: str, produced: int, topic: str) -> Any:
    """The drill invariants: rows == records produced, distinct (partition, offset) == rows, the last ledger
    commit ends at the topic's end offsets, no orphan data files."""
    table = open_table(cfg, create=False)
    data = table.scan(selected_fields=("_kafka_topic", "_kafka_partition", "_kafka_offset")).to_arrow()
    assert data.num_rows == produced
    keys = set(zip(data["_kafka_topic"].to_pylist(), data["_kafka_partition"].to_pylist(),
                   data["_kafka_offset"].to_pylist()))
    assert len(keys) == data.num_rows
    last = ledger.latest_commit(table, cfg.handoff_id)
    assert last is not None
    assert last.end_offsets[topic] == end_offsets(bootstrap, topic)
    assert ledger.resume_offsets(table)[topic] == end_offsets(bootstrap, topic)
    assert maintenance.orphan_files(table) == []
    return table


@contextlib.contextmanager
def answering_after(seconds: float, target: str, log: Path) -> Iterator[int]:
    """A loopback port where nothing answers for `seconds`, then a relay from it to `target` (host:port): a service
    that comes up late (the drills of a driver's start that waits for its table's service). Yields the port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    relays: list[Any] = []
    timer = threading.Timer(seconds, lambda: relays.append(start_relay("127.0.0.1", target, log, port=port)[0]))
    timer.start()
    try:
        yield port
    finally:
        timer.cancel()
        timer.join()
        for relay in relays:
            relay.stop()
