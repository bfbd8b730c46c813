"""`handoff run -f manifest.yaml --available-now`: a StreamTableHandoff manifest run locally end to end —
Kafka → handoff-kafka → decode/DLQ → handoff-iceberg (SQLite catalog) — drains the topic and exits 0."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from handoff_testbed.eventually import eventually
from handoff_testbed.process_tree import process_tree, running

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

MANIFEST = """\
apiVersion: handoff.io/v1alpha1
kind: StreamTableHandoff
metadata:
  name: clicks
  namespace: web
spec:
  source:
    bootstrapServers: {bootstrap}
    topics: [{topic}]
    maxRecordsPerBatch: 40
  sink:
    iceberg:
      catalog:
        name: runtest
        properties:
          type: sql
          uri: sqlite:///{tmp}/catalog.db
          warehouse: file://{tmp}/warehouse
      table: web.clicks
  schema:
    columns:
      - {{name: id, type: long, required: true}}
      - {{name: page, type: string}}
    onIncompatible: deadLetter
  deadLetter:
    topic: {topic}.dlq
  commitInterval: 1s
"""


def test_handoff_run_available_now_drains_into_iceberg_and_exits_zero(kafka, tmp_path: Path) -> None:
    topic = f"clicks-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    kafka.create_topic(f"{topic}.dlq", partitions=1)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(100):
        p.produce(topic, json.dumps({"id": i, "page": f"/p{i % 7}"}).encode(), partition=i % 2)
    p.produce(topic, b"not json", partition=0)
    p.produce(topic, b'{"page": "/no-id"}', partition=1)
    assert p.flush(30) == 0
    manifest = tmp_path / "clicks.yaml"
    manifest.write_text(MANIFEST.format(bootstrap=kafka.bootstrap, topic=topic, tmp=tmp_path))
    run = subprocess.run([sys.executable, "-m", "handoff_operator", "run", "-f", str(manifest), "--available-now",
                          "--checkpoint", str(tmp_path / "ck")], capture_output=True, text=True, timeout=600)
    out = run.stdout
    assert run.returncode == 0, (out + run.stderr)[-4000:]
    # every batch is Spark's query's, from its batch 0 on
    batch_lines = [line for line in out.splitlines() if line.startswith("batch ")]
    assert batch_lines[0].startswith("batch 0: "), out
    assert len(batch_lines) >= 3 and all("snapshot " in line for line in batch_lines), out
    assert all(" freshness " in line for line in batch_lines), out  # newest committed event time, from the sink
    assert out.splitlines()[-1] == "done"

    from handoff_spark.iceberg import ledger

    table = ledger.load_table("runtest", {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                                          "warehouse": f"file://{tmp_path}/warehouse"}, "web.clicks")
    rows = table.scan().to_arrow()
    assert sorted(rows.column("id").to_pylist()) == list(range(100))
    assert len({(r["_kafka_partition"], r["_kafka_offset"]) for r in rows.select(
        ["_kafka_partition", "_kafka_offset"]).to_pylist()}) == 100
    assert ledger.resume_offsets(table) == {topic: {0: 51, 1: 51}}
    commits = ledger.list_commits(table, "web/clicks")
    assert sum(c.rows for c in commits) == 100 and sum(c.dlq_rows for c in commits) == 2

    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"t-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest"})
    c.subscribe([f"{topic}.dlq"])
    letters = []
    for _ in range(30):
        letters += [m for m in c.consume(10, timeout=1) if m.error() is None]
        if len(letters) >= 2:
            break
    c.close()
    reasons = sorted(dict(m.headers())["handoff.reason"].decode() for m in letters)
    assert reasons == ["missing-required", "unparseable"]


# -- two local runs side by side, their metrics ports, and what a kill -9 leaves -----------------------------------

HANDOFF = str(Path(sys.executable).with_name("handoff"))  # the console script a user types
DEFAULT_METRICS_PORT = 9090  # the operator's (render.METRICS_PORT), which `handoff run` renders too
#: What a driver may leave in its temp dir when killed: directories named by its pid, which the next one removes
#: (handoff_spark.driver.temp_dirs): stop markers, its JVM's java.io.tmpdir, its session launch's temporary files, warm-up
#: queries, `handoff run`'s config.
OWNED = re.compile(r"^handoff-(stop|jvm|launch|warmup|session-warmup|run)-(\d+)-")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def _metrics_line(log: Path, proc: subprocess.Popen[bytes]) -> str | None:
    assert proc.poll() is None, log.read_text()[-4000:]
    return next((line for line in log.read_text().splitlines() if line.startswith("metrics on :")), None)


def _scrape(port: int) -> str | None:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except OSError:
        return None


def _rows_committed(port: int, handoff: str) -> float:
    text = _scrape(port) or ""
    match = re.search(rf'^handoff_rows_total{{handoff="{re.escape(handoff)}"}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def _owners(tmp: Path) -> dict[str, int | None]:
    """Each entry of the runs' temp dir: the pid of the driver that owns it, or None for one nobody removes."""
    return {p.name: (int(m.group(2)) if (m := OWNED.match(p.name)) else None) for p in tmp.iterdir()}


def test_two_local_runs_side_by_side_and_kill_9_leaves_nothing_behind(kafka, tmp_path: Path) -> None:
    """`handoff run --metrics-port N` serves on N. A second local run beside it, with the default port taken,
    serves on a free port and prints it. `kill -9` of the first leaves no process; what it leaves in the temp dir
    are only its own directories, which the next driver removes. A run asking for a taken port fails in one line
    whose fix (`--metrics-port 0`) works. The session's warm-up: run b's is set `before` and ends before its
    stream's query starts; a switch set to a value it does not take is refused in one line."""
    topic = f"clicks-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    kafka.create_topic(f"{topic}.dlq", partitions=1)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(100):
        p.produce(topic, json.dumps({"id": i, "page": f"/p{i % 7}"}).encode(), partition=i % 2)
    assert p.flush(30) == 0
    tmp = tmp_path / "tmp"  # the runs' TMPDIR: what is in it, they left
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1"}
    manifests = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        manifests[name] = tmp_path / name / "clicks.yaml"
        manifests[name].write_text(MANIFEST.format(bootstrap=kafka.bootstrap, topic=topic, tmp=tmp_path / name)
                                   .replace("name: clicks", f"name: clicks-{name}"))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b", "c", "d", "e")}

    def start(name: str, manifest: str, *args: str, warmup_at: str | None = None) -> subprocess.Popen[bytes]:
        run_env = env if warmup_at is None else {**env, "HANDOFF_SESSION_WARMUP_AT": warmup_at}
        with logs[name].open("wb") as out:
            procs[name] = subprocess.Popen([HANDOFF, "run", "-f", str(manifests[manifest]), "--checkpoint",
                                            str(tmp_path / manifest / "ck"), *args],
                                           stdout=out, stderr=subprocess.STDOUT, env=run_env)
        return procs[name]

    default_port = socket.socket()
    try:
        try:  # the default port taken, by this test or another process: the second run must serve elsewhere
            default_port.bind(("0.0.0.0", DEFAULT_METRICS_PORT))
            default_port.listen()
        except OSError:
            pass
        port_a = _free_port()
        a = start("a", "a", "--metrics-port", str(port_a))
        line_a = eventually(lambda: _metrics_line(logs["a"], a), "run a's metrics line", timeout=300, interval=0.5)
        assert line_a == f"metrics on :{port_a}/metrics"
        # A switch set to what it does not take: refused in one line naming it and what it takes; that fix works.
        e = start("e", "b", warmup_at="after")
        assert e.wait(120) == 2, logs["e"].read_text()[-4000:]
        refusal = logs["e"].read_text().strip().splitlines()[-1]
        assert refusal == "handoff: HANDOFF_SESSION_WARMUP_AT='after': use beside or before", refusal
        b = start("b", "b", warmup_at="before")
        line_b = eventually(lambda: _metrics_line(logs["b"], b), "run b's metrics line", timeout=300,
                            interval=0.5)
        match = re.fullmatch(rf"metrics on :(\d+)/metrics \(port {DEFAULT_METRICS_PORT} is taken\)", line_b)
        assert match, line_b
        port_b = int(match.group(1))
        assert port_b not in (port_a, DEFAULT_METRICS_PORT)
        # both work: every record committed by each, as its own metrics say, and Spark's query started in each
        for name, proc, port in (("a", a, port_a), ("b", b, port_b)):
            eventually(lambda n=name, p=proc, port=port: _rows_committed(port, f"web/clicks-{n}") == 100
                       and p.poll() is None, f"run {name}'s 100 rows", timeout=300, interval=0.5)
            eventually(lambda n=name, p=proc: p.poll() is None
                       and re.search(r"^query \S+ started", logs[n].read_text(), re.M), f"run {name}'s query",
                       timeout=300, interval=0.5)
        # The session's warm-up ran in both: by default beside the stream's first batch; set `before` (run b), to
        # its end before the stream's query started, so Spark's first batch found its daemons started.
        assert re.search(r"session warm-up (done in|stopped|failed)", logs["a"].read_text()), \
            logs["a"].read_text()[-4000:]
        lines_b = logs["b"].read_text().splitlines()
        warmed = [i for i, line in enumerate(lines_b) if "session warm-up done in" in line]
        started = [i for i, line in enumerate(lines_b) if re.match(r"query \S+ started", line)]
        assert warmed and started and warmed[0] < started[0], "\n".join(lines_b)[-4000:]

        tree_a = process_tree(a.pid)
        assert len(tree_a) > 1  # the driver and its JVM at least
        a.send_signal(signal.SIGKILL)
        a.wait()
        eventually(lambda: not running(tree_a), "run a's JVM and Python workers gone", timeout=120, interval=0.5)
        assert _scrape(port_b) and b.poll() is None  # the other run is untouched
        left = _owners(tmp)
        assert {owner for owner in left.values()} <= {a.pid, b.pid}, left
        assert any(owner == a.pid for owner in left.values()), left

        # a port that is taken, asked for: one line, and the fix it names works
        c = start("c", "a", "--metrics-port", str(port_b))
        assert c.wait(300) == 2, logs["c"].read_text()[-4000:]
        refusal = logs["c"].read_text().strip().splitlines()[-1]
        assert refusal.startswith(f"handoff: metrics port {port_b} cannot be used") and "Traceback" not in refusal
        assert "`handoff run --metrics-port 0`" in refusal
        d = start("d", "a", "--metrics-port", "0", "--available-now")
        assert d.wait(600) == 0, logs["d"].read_text()[-4000:]
        assert re.search(r"^metrics on :\d+/metrics$", logs["d"].read_text(), re.M), logs["d"].read_text()[-4000:]
        # the next driver removed what the killed one (and the refused one) left
        left = _owners(tmp)
        assert {owner for owner in left.values()} <= {b.pid, d.pid}, left

        tree_b = process_tree(b.pid)
        b.send_signal(signal.SIGKILL)
        b.wait()
        eventually(lambda: not running(tree_b), "run b's JVM and Python workers gone", timeout=120, interval=0.5)
        assert {owner for owner in _owners(tmp).values()} <= {b.pid, d.pid}
    finally:
        default_port.close()
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
