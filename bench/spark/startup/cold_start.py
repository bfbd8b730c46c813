"""Cold start: how soon a (re)started driver commits, and how much slower its first batch is than a warm one.

Every restart (a crash, an upgrade, a replay, a failover) pays it, so it bounds freshness under faults.
Per pipeline, one driver process at a time (Spark local[2], SQLite catalog, 1 s processing-time trigger):
  1. `clean`: N records are waiting in the topic (one Kafka transaction, so they appear at once); the driver
     starts on an empty checkpoint → time to its first committed snapshot, that batch's duration; then N more
     appear → that (warm) batch's duration;
  2. `kill -9`: the driver's whole process group is killed with SIGKILL, N more appear while it is down, the
     same driver restarts on its checkpoint → time to its first commit, first batch, then a warm batch of N.
The driver is stopped (SIGTERM) at the end and the table checked: rows == distinct (partition, offset) == 4 N.
Pipelines: `handoff` (`python -m handoff_spark run`, the driver as the operator runs it) and, as the baseline
in the same run, `jvm` (Spark's JVM Kafka source, spark-sql-kafka, into the same `handoff-iceberg` sink; this script
itself is that driver with `--jvm-driver`). "start → commit" is from the process start to the first snapshot's
commit timestamp (the table's own clock); the batch durations are Spark's (`durationMs.triggerExecution`).
Variants: `handoff-warmfirst` (the session warm-up before the query), `handoff-nowarmup` (no warm-up),
`handoff-nocds` (the CDS archive off), `jvm-nocds`, `handoff-noforkserver` and `jvm-noforkserver` (Spark's Python
processes started as fresh interpreters, not forked from `startup.fork_server`), and `before` (`--before REF`: REF's
driver, exported with `git archive`, run first in the same run). Each phase also records when every process of the driver's session
(JVM, PySpark daemons and their forks, runners) first appears, up to the first commit.
The driver's output, each line stamped with its time since start, goes to `<tmp>/<pipeline>-<phase>.log`.
`--chaos SECONDS` instead runs the chaos mode (see `chaos`). Prints a table and writes bench/results/cold_start.json.

    .venv/bin/python bench/spark/startup/cold_start.py [--records 30000] [--pipelines handoff,jvm] [--before main] [--bootstrap HOST:PORT]
    .venv/bin/python bench/spark/startup/cold_start.py --chaos 180 [--rate 2000] [--kill-every 15,30]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
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

from bench_kafka import add_broker_argument  # noqa: E402
import proc_cpu  # noqa: E402
from bench_pipelines import COLUMNS  # noqa: E402  (the same table as the throughput benchmark)

PARTITIONS = 3
#: At most this many rounds of N more records while waiting for a warm Spark batch (phase).
MAX_ROUNDS = 30
BATCH_LINE = re.compile(r"batch (\d+): (\d+) rows in (\d+) ms")


def produce_txn(bootstrap: str, topic: str, first_id: int, n: int) -> None:
    """`n` records in one Kafka transaction: a read_committed reader sees all of them at once or none."""
    import datetime as dt

    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000,
                  "queue.buffering.max.messages": 1_000_000, "transactional.id": f"cold-{uuid.uuid4().hex}"})
    p.init_transactions(30)
    p.begin_transaction()
    now = dt.datetime.now(dt.timezone.utc)
    for i in range(first_id, first_id + n):
        v = json.dumps({"id": i, "ts": now.isoformat(timespec="milliseconds"), "customer": f"c{i % 9973:05d}",
                        "amount": round(i * 0.37 % 500, 2), "region": ("eu", "us", "ap")[i % 3],
                        "note": "x" * 60}).encode()
        while True:
            try:
                p.produce(topic, v, partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    p.commit_transaction(60)


def create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the future resolves
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until every partition has a leader
        md = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == PARTITIONS and \
                all(p.leader >= 0 for p in md.partitions.values()):
            return
        time.sleep(0.2)


def settle_broker(bootstrap: str, n: int) -> float:
    """Produce 2·`n` records to a topic of their own and read them back with a read_committed consumer, before any
    pipeline is measured; returns the seconds it took.

    Why: the pipeline that ran first in a run measured slower than the same pipeline run later (the JVM source's first
    batch after a clean start 3.9 s first, 2.9 s second; docs/benchmarks.md, "Session 50"): the broker, a fresh JVM,
    compiles its produce and fetch paths while that pipeline waits on them."""
    from confluent_kafka import Consumer, TopicPartition

    started = time.monotonic()
    topic = f"cold-settle-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic)
    produce_txn(bootstrap, topic, 0, 2 * n)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "enable.auto.commit": False,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        seen, deadline = 0, time.monotonic() + 120
        while seen < 2 * n and time.monotonic() < deadline:
            seen += sum(1 for m in consumer.consume(10_000, 1.0) if m.error() is None)
    finally:
        consumer.close()
    return round(time.monotonic() - started, 2)


def app_config(bootstrap: str, topic: str, tmp: Path, pipeline: str, extra_conf: dict[str, str]) -> Any:
    from handoff_spark.config import AppConfig

    return AppConfig.model_validate({
        "handoffId": f"bench/cold-{pipeline}", "source": {"bootstrapServers": bootstrap, "topics": [topic]},
        "sink": {"kind": "iceberg", "catalogName": f"cold-{pipeline}", "table": "bench.cold",
                 "catalogProperties": {"type": "sql", "uri": f"sqlite:///{tmp}/{pipeline}.db",
                                       "warehouse": f"file://{tmp}/{pipeline}-wh"}},
        "schema": {"columns": COLUMNS, "onIncompatible": "halt", "evolution": "none"},
        "checkpointLocation": str(tmp / f"ck-{pipeline}"), "triggerIntervalSeconds": 1,
        "sparkConf": {"spark.master": "local[2]", **extra_conf}})


#: The fork server's label: its children are forks, shown with the module each stands for (fork_server.retitle).
FORK_SERVER = "handoff_spark.startup.fork_server"


class ProcessTimeline:
    """When each process of the driver's session (its JVM, every PySpark daemon, forked worker and runner)
    first appears, sampled from /proc every 0.2 s: where a first micro-batch's fresh interpreters start.
    A PySpark daemon's forked workers carry their daemon's command line, and the fork server's forks the command
    they stand for; both are marked `fork`."""

    def __init__(self, sid: int, t0: float) -> None:
        self.sid, self.t0 = sid, t0
        self.seen: dict[int, dict[str, Any]] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            self.sample()
            self.stopped.wait(0.2)

    def sample(self) -> None:
        for pid in proc_cpu.pids():
            known = self.seen.get(int(pid))
            if known is not None:
                if not known["settled"]:  # a launcher script that exec's the JVM later: relabel
                    try:
                        argv = proc_cpu.argv_of(pid)
                    except OSError:
                        continue
                    known["what"], known["settled"] = proc_cpu.process_label(argv), proc_cpu.settled(argv)
                continue
            try:
                fields, argv = proc_cpu.stat_of(pid), proc_cpu.argv_of(pid)
            except OSError:
                continue
            if int(fields[3]) != self.sid:
                continue
            ppid = int(fields[1])
            label = proc_cpu.process_label(argv)
            parent = self.seen.get(ppid)
            if parent is not None and (parent["what"] == label or parent["what"].startswith(FORK_SERVER)):
                label = "fork " + label
            self.seen[int(pid)] = {"at_s": round(time.perf_counter() - self.t0, 2), "what": label,
                                   "pid": int(pid), "ppid": ppid, "settled": proc_cpu.settled(argv)}

    def stop(self) -> list[dict[str, Any]]:
        self.stopped.set()
        self.thread.join(2)
        return sorted(self.seen.values(), key=lambda x: x["at_s"])


class Driver:
    """One driver process (own process group, so kill -9 takes its JVM too); its output lines are stamped with
    the seconds since start and kept (for the log and to find batch lines). `code_root`: where its
    `handoff_spark` comes from (this checkout, or an exported older revision to compare with)."""

    def __init__(self, argv: list[str], log: Path, extra_env: dict[str, str] | None = None,
                 code_root: Path = ROOT) -> None:
        env = {**os.environ, **(extra_env or {}),
               "PYTHONPATH": os.pathsep.join([str(code_root / "spark_app"), str(ROOT / "hack"), str(ROOT / "bench")]),
               "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        self.log = log
        self.lines: list[tuple[float, str]] = []
        self.started_epoch = time.time()
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                     start_new_session=True)
        self.timeline = ProcessTimeline(self.proc.pid, self.t0)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.log.open("a") as fh:
            for line in self.proc.stdout:
                at = time.perf_counter() - self.t0
                self.lines.append((at, line.rstrip()))
                fh.write(f"[{at:7.2f}] {line}")
                fh.flush()

    def batches(self) -> list[dict[str, Any]]:
        out = []
        for at, line in list(self.lines):
            m = BATCH_LINE.search(line)
            if m and "snapshot" in line:
                out.append({"batch": int(m[1]), "rows": int(m[2]), "ms": int(m[3]), "seen_at_s": round(at, 2),
                            "bootstrap": line.lstrip().startswith("bootstrap ")})
        return out

    def wait_rows(self, total_rows: int, timeout: float) -> list[dict[str, Any]]:
        """Until the committed batches of this process add up to `total_rows`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            b = self.batches()
            if sum(x["rows"] for x in b) >= total_rows:
                return b
            if self.proc.poll() is not None:
                raise RuntimeError(f"driver exited {self.proc.returncode}; see {self.log}")
            time.sleep(0.1)
        raise TimeoutError(f"no commit of {total_rows} rows within {timeout:.0f} s; see {self.log}")

    def kill9(self) -> None:
        self.timeline.stop()
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.reader.join(5)

    def stop(self) -> None:
        self.timeline.stop()
        if self.proc.poll() is None:
            # the driver only, as Kubernetes stops a pod's main process: it stops at a batch boundary and its
            # JVM with it (a SIGTERM to the whole group killed the JVM and Spark's Python runners under it)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.kill9()
        self.reader.join(5)


#: Handoff driver variants: extra environment per pipeline name (`handoff`: the driver as shipped). A start-up
#: candidate behind an environment switch gets its own entry here, measured beside `handoff` in the same run.
PIPELINE_ENV: dict[str, dict[str, str]] = {"handoff": {},
                                         "handoff-nocds": {"HANDOFF_SPARK_CDS_ARCHIVE": "off"},
                                         # the session's warm-up to its end before the stream's query, not beside
                                         # its first batch (startup.session_warmup)
                                         "handoff-warmfirst": {"HANDOFF_SESSION_WARMUP_AT": "before"},
                                         # the session's warm-up off
                                         "handoff-nowarmup": {"HANDOFF_SESSION_WARMUP": "0"},
                                         # Spark's Python processes fresh interpreters, not forks (startup.fork_server)
                                         "handoff-noforkserver": {"HANDOFF_FORK_SERVER": "0"}}
#: Handoff driver variants whose `handoff_spark` is another revision's (`--before REF`): pipeline → code root.
PIPELINE_ROOT: dict[str, Path] = {}


def export_revision(ref: str, tmp: Path) -> Path:
    """`ref`'s spark_app/ exported (git archive) under `tmp`: the driver as it was, to measure beside this one. Its C
    extensions (a revision with a setup.py) are built in place: git holds their sources, not the built modules."""
    where = tmp / f"rev-{ref.replace('/', '_')}"
    where.mkdir(parents=True)
    present = set(subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", ref], check=True,
                                 capture_output=True, text=True).stdout.split())
    paths = ["spark_app"] + [p for p in ("setup.py", "pyproject.toml", "README.md", "operator") if p in present]
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, *paths], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    if "setup.py" in present:
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=where, check=True,
                       capture_output=True)
    return where


#: The baseline's variants (Spark's JVM Kafka source), with their extra environment.
JVM_PIPELINES: dict[str, dict[str, str]] = {"jvm": {}, "jvm-nocds": {"HANDOFF_SPARK_CDS_ARCHIVE": "off"},
                                           "jvm-noforkserver": {"HANDOFF_FORK_SERVER": "0"}}


def pipeline_env(pipeline: str) -> dict[str, str] | None:
    return PIPELINE_ENV.get(pipeline, JVM_PIPELINES.get(pipeline))


def driver_argv(pipeline: str, app_json: Path) -> list[str]:
    if pipeline in JVM_PIPELINES:
        return [sys.executable, str(Path(__file__).resolve()), "--jvm-driver", str(app_json)]
    if pipeline in PIPELINE_ENV or pipeline in PIPELINE_ROOT:
        return [sys.executable, "-m", "handoff_spark", "run", "--config", str(app_json)]
    raise SystemExit(f"unknown pipeline {pipeline!r}: one of {', '.join([*PIPELINE_ENV, *JVM_PIPELINES])}")


def snapshots_after(cfg: Any, epoch: float) -> list[int]:
    from handoff_spark.iceberg import ledger

    table = ledger.load_table(cfg.sink.catalog_name, dict(cfg.sink.catalog_properties), cfg.sink.table)
    return sorted(s.timestamp_ms for s in table.metadata.snapshots if s.timestamp_ms >= epoch * 1000)


def table_check(cfg: Any) -> dict[str, int]:
    from handoff_spark.iceberg import ledger

    table = ledger.load_table(cfg.sink.catalog_name, dict(cfg.sink.catalog_properties), cfg.sink.table)
    data = table.scan(selected_fields=("_kafka_partition", "_kafka_offset", "id")).to_arrow()
    return {"rows": data.num_rows,
            "distinct_offsets": len(set(zip(data["_kafka_partition"].to_pylist(),
                                            data["_kafka_offset"].to_pylist()))),
            "distinct_ids": len(set(data["id"].to_pylist()))}


def phase(drv: Driver, cfg: Any, rows_before: int, n: int, produce_more: Any) -> dict[str, Any]:
    """First commit of a freshly started `drv` (its backlog is `n` rows), then batches of `n` more until one ran
    warm: the first one Spark runs after the driver's bootstrap batch (if any) still pays Spark's start-up (its
    fresh Python interpreters), so it is reported apart, and another `n` is produced for the warm batch."""
    first = drv.wait_rows(n, timeout=900)
    snaps = snapshots_after(cfg, drv.started_epoch)
    start_to_commit = (snaps[0] / 1000 - drv.started_epoch) if snaps else None
    # N more each time the table has caught up, until Spark has run a batch after its first one (a warm one): a
    # running stream's bootstrap batches take what arrives while Spark's session starts and warms up
    total, batches = n, first
    for _ in range(MAX_ROUNDS):
        spark = [b for b in batches if not b["bootstrap"]]
        if len(spark) >= 2:
            break
        produce_more()
        total += n
        batches = drv.wait_rows(total, timeout=900)
    first_spark, warm = spark[0], spark[1:]
    return {"start_to_first_commit_s": None if start_to_commit is None else round(start_to_commit, 2),
            "first_is_bootstrap": first[0]["bootstrap"],
            "first_batches": first, "first_batch_ms": first[0]["ms"], "first_batch_rows": first[0]["rows"],
            # Spark's first batch of this driver (the first one when there is no bootstrap batch)
            "first_spark_batch_ms": first_spark["ms"], "first_spark_batch_rows": first_spark["rows"],
            "first_spark_batch_seen_at_s": first_spark["seen_at_s"],
            "bootstrap_batches": sum(1 for b in batches if b["bootstrap"]),
            # the longest the table went without a commit from the driver's start to its first warm Spark batch,
            # while records waited (N more were produced each time it had caught up)
            "longest_commit_gap_s": longest_gap([b["seen_at_s"] for b in batches], warm[0]["seen_at_s"]),
            "warm_batches": warm, "warm_batch_ms": max(b["ms"] for b in warm),
            "warm_batch_rows": sum(b["rows"] for b in warm),
            "first_over_warm": round(first[0]["ms"] / max(1, max(b["ms"] for b in warm)), 2),
            "produced_in_phase": total,
            "startup_lines": [f"[{at:6.2f}] {line}" for at, line in drv.lines
                              if any(k in line for k in ("handoff.app", "batch 0:", "handoff.jvm", "first batch",
                                                         "bootstrap", "warm-up"))][:30],
            "processes_until_first_commit": first_sightings(drv.timeline.seen.values(), first[-1]["seen_at_s"]),
            # where Spark's own first batch spends its time (the fresh interpreters it starts), bootstrap or not
            "processes_until_first_spark_commit": first_sightings(drv.timeline.seen.values(),
                                                                  first_spark["seen_at_s"])}


def first_sightings(procs: Any, until_s: float) -> list[str]:
    """`at  what (×count)` for each kind of process first seen up to `until_s`, in order of first sight."""
    kinds: dict[str, list[float]] = {}
    for p in sorted(procs, key=lambda x: x["at_s"]):
        if p["at_s"] <= until_s:
            kinds.setdefault(p["what"], []).append(p["at_s"])
    return [f"{ats[0]:6.2f} s  {what}" + (f" (x{len(ats)})" if len(ats) > 1 else "") for what, ats in kinds.items()]


def run_pipeline(pipeline: str, bootstrap: str, tmp: Path, n: int, extra_conf: dict[str, str]) -> dict[str, Any]:
    topic = f"cold-{pipeline}-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic)
    cfg = app_config(bootstrap, topic, tmp, pipeline, extra_conf)
    app_json = tmp / f"{pipeline}.json"
    app_json.write_text(cfg.to_json())
    next_id = [0]

    def more() -> None:
        produce_txn(bootstrap, topic, next_id[0], n)
        next_id[0] += n

    out: dict[str, Any] = {"topic": topic}
    more()
    root = PIPELINE_ROOT.get(pipeline, ROOT)
    drv = Driver(driver_argv(pipeline, app_json), tmp / f"{pipeline}-clean.log", pipeline_env(pipeline), root)
    try:
        out["clean"] = phase(drv, cfg, next_id[0] - n, n, more)
    finally:
        drv.kill9()
    more()
    drv = Driver(driver_argv(pipeline, app_json), tmp / f"{pipeline}-kill9.log", pipeline_env(pipeline), root)
    try:
        out["after_kill9"] = phase(drv, cfg, next_id[0] - n, n, more)
    finally:
        drv.stop()
    out["table"] = table_check(cfg)
    out["table"]["produced"] = next_id[0]
    out["table"]["whole"] = (out["table"]["rows"] == out["table"]["distinct_offsets"] == out["table"]["distinct_ids"]
                             == next_id[0])
    return out


def jvm_driver(app_json: str) -> int:
    """The baseline's driver: Spark's JVM Kafka source → handoff-iceberg, the same session/sink/trigger/reporting
    as `handoff_spark.driver.app.run` (session start logged the same way)."""
    import logging
    import threading as th

    from bench_pipelines import jvm_query, spark_kafka_jars

    from handoff_spark.sink import registry as sinks
    from handoff_spark.driver.app import ProgressReporter, build_session, wait
    from handoff_spark.config import AppConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    log = logging.getLogger("handoff.jvm")
    cfg = AppConfig.load(app_json)
    cfg = cfg.model_copy(update={"spark_conf": {**cfg.spark_conf, "spark.jars": ",".join(spark_kafka_jars())}})
    sinks.get("iceberg").prepare(cfg)
    log.info("table prepared")
    spark = build_session(cfg)
    log.info("spark session started")
    query = jvm_query(spark, cfg, cfg.source.topics[0], PARTITIONS, "iceberg", 0, cfg.trigger_interval_seconds)
    log.info("query started")
    return wait(query, th.Event(), lambda line: print(line, flush=True),
                ProgressReporter(cfg, None, lambda line: print(line, flush=True)))


def longest_gap(seen_at_s: list[float], until_s: float) -> float:
    """The longest stretch of [0, until_s] without a commit, given the commits' times."""
    marks = [0.0] + sorted(t for t in seen_at_s if t <= until_s) + [until_s]
    return round(max(y - x for x, y in zip(marks, marks[1:])), 2)


def chaos(bootstrap: str, tmp: Path, seconds: float, rate: int, kill_every: tuple[float, float],
          pipeline: str = "handoff") -> dict[str, Any]:
    """A producer writes `rate` records/s for `seconds` while the handoff driver is killed with SIGKILL every
    `kill_every` seconds (uniform) and restarted at once; afterwards the driver drains the rest and stops.
    Reported: per driver life, its length and the batches it committed; the table check."""
    from confluent_kafka import Producer

    topic = f"chaos-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic)
    cfg = app_config(bootstrap, topic, tmp, f"chaos-{pipeline}", {})
    app_json = tmp / f"chaos-{pipeline}.json"
    app_json.write_text(cfg.to_json())
    stop = threading.Event()
    produced = [0]

    def producer() -> None:
        import datetime as dt

        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
        t0 = time.monotonic()
        while not stop.is_set():
            due = int((time.monotonic() - t0) * rate)
            while produced[0] < due:
                i = produced[0]
                p.produce(topic, json.dumps({"id": i, "ts": dt.datetime.now(dt.timezone.utc).isoformat(),
                                             "customer": f"c{i % 9973:05d}", "amount": 1.0, "region": "eu"}))
                produced[0] += 1
            p.poll(0)
            time.sleep(0.01)
        assert p.flush(60) == 0

    prod = threading.Thread(target=producer, daemon=True)
    prod.start()
    lives: list[dict[str, Any]] = []
    rng = random.Random(15)
    t_end = time.monotonic() + seconds
    life = 0
    while time.monotonic() < t_end:
        drv = Driver(driver_argv(pipeline, app_json), tmp / f"chaos-{pipeline}-{life}.log", pipeline_env(pipeline))
        live = min(rng.uniform(*kill_every), max(0.0, t_end - time.monotonic()))
        time.sleep(live)
        drv.kill9()
        b = drv.batches()
        lives.append({"life": life, "seconds": round(live, 1), "commits": len(b), "rows": sum(x["rows"] for x in b),
                      "bootstrap_commits": sum(1 for x in b if x["bootstrap"]),
                      "spark_commits": sum(1 for x in b if not x["bootstrap"]),
                      "first_commit_seen_at_s": b[0]["seen_at_s"] if b else None,
                      # the longest this life went without a commit (start → first, between two, last → kill)
                      "longest_commit_gap_s": longest_gap([x["seen_at_s"] for x in b], live)})
        print(f"life {life}: {live:.1f} s, {len(b)} commits, first at "
              f"{b[0]['seen_at_s'] if b else '-'} s, longest gap {lives[-1]['longest_commit_gap_s']} s", flush=True)
        life += 1
    stop.set()
    prod.join()
    drv = Driver(driver_argv(pipeline, app_json), tmp / f"chaos-{pipeline}-drain.log", pipeline_env(pipeline))
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            check = table_check(cfg)
            if check["rows"] >= produced[0]:
                break
            time.sleep(2)
    finally:
        drv.stop()
    check = table_check(cfg)
    check["produced"] = produced[0]
    check["whole"] = check["rows"] == check["distinct_offsets"] == check["distinct_ids"] == produced[0]
    return {"pipeline": pipeline, "seconds": seconds, "rate": rate, "kill_every": kill_every, "lives": lives,
            "lives_with_commits": sum(1 for x in lives if x["commits"]),
            "lives_with_spark_commits": sum(1 for x in lives if x["spark_commits"]), "table": check}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=30_000, help="N: the backlog and the warm batch size")
    ap.add_argument("--pipelines", default="handoff,handoff-warmfirst,handoff-nowarmup,jvm",
                    help="for --chaos: the handoff variants among them (default: handoff)")
    ap.add_argument("--before", default=None, metavar="REF",
                    help="also run pipeline `before`: the handoff driver of git revision REF (e.g. main), first")
    add_broker_argument(ap)
    ap.add_argument("--conf", action="append", default=[], help="extra Spark conf KEY=VALUE for every driver")
    ap.add_argument("--label", default="", help="a name for this run in the JSON (e.g. what was changed)")
    ap.add_argument("--chaos", type=float, default=0, help="run the chaos mode for this many seconds instead")
    ap.add_argument("--rate", type=int, default=2000, help="chaos: records/s produced")
    ap.add_argument("--kill-every", default="15,30", help="chaos: kill -9 after uniform(lo, hi) seconds")
    ap.add_argument("--jvm-driver", help=argparse.SUPPRESS)
    ap.add_argument("--no-settle", dest="settle", action="store_false",
                    help="measure the first pipeline against a broker that has served nothing yet (settle_broker)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.jvm_driver:
        return jvm_driver(args.jvm_driver)
    # A SIGTERM ends the run through the finally blocks (drivers and the test-bed broker are stopped).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from bench_kafka import broker

    extra = dict(kv.split("=", 1) for kv in args.conf)
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    with broker(args.bootstrap) as (bootstrap, _kafka):
        tmp = Path(tempfile.mkdtemp(prefix="bench-cold-"))
        print(f"logs in {tmp}", flush=True)
        pipelines = [p for p in args.pipelines.split(",") if p]
        if args.before:
            PIPELINE_ROOT["before"] = export_revision(args.before, tmp)
            pipelines.insert(0, "before")
        if args.chaos:
            lo, hi = (float(x) for x in args.kill_every.split(","))
            for pipeline in [p for p in pipelines if p in PIPELINE_ENV]:  # the handoff driver's variants
                results[f"chaos-{pipeline}"] = chaos(bootstrap, tmp, args.chaos, args.rate, (lo, hi), pipeline)
        else:
            if args.settle:
                print(f"broker settled in {settle_broker(bootstrap, args.records)} s", flush=True)
            for pipeline in pipelines:
                results[pipeline] = run_pipeline(pipeline, bootstrap, tmp, args.records, extra)
    doc = {"records": args.records, "label": args.label, "before": args.before, "conf": extra, "cpus": os.cpu_count(),
           "broker_settled": args.settle and not args.chaos,
           "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": results}
    out = Path(args.out or ROOT / "bench" / "results" / ("cold_start_chaos.json" if args.chaos else "cold_start.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    if args.chaos:
        for name, c in results.items():
            print(f"\n{name}: {len(c['lives'])} lives, {c['lives_with_commits']} committed "
                  f"({c['lives_with_spark_commits']} through Spark); longest commit gap in a life "
                  f"{max(x['longest_commit_gap_s'] for x in c['lives'])} s; table {c['table']}")
    else:
        print("\n| pipeline | phase | start → first commit | first batch (rows) | first Spark batch (rows) | "
              "warm batch (rows) | first / warm | first Spark / warm | bootstrap batches | longest commit gap |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, r in results.items():
            for ph in ("clean", "after_kill9"):
                p = r[ph]
                boot = " (bootstrap)" if p["first_is_bootstrap"] else ""
                print(f"| {name} | {ph} | {p['start_to_first_commit_s']} s | {p['first_batch_ms']} ms "
                      f"({p['first_batch_rows']}){boot} | {p['first_spark_batch_ms']} ms ({p['first_spark_batch_rows']}, "
                      f"seen at {p['first_spark_batch_seen_at_s']} s) | {p['warm_batch_ms']} ms ({p['warm_batch_rows']}) | "
                      f"{p['first_over_warm']} | {p['first_spark_batch_ms'] / max(1, p['warm_batch_ms']):.2f} | "
                      f"{p['bootstrap_batches']} | {p['longest_commit_gap_s']} s |")
            print(f"| {name} | table | {r['table']} | | | | | | | |")
        for name, r in results.items():
            for ph in ("clean", "after_kill9"):
                print(f"\n{name} {ph}: processes until the first commit")
                print("\n".join(r[ph]["processes_until_first_commit"]))
                print(f"{name} {ph}: processes until Spark's first commit")
                print("\n".join(r[ph]["processes_until_first_spark_commit"]))
    print(f"load average before {load_before}, after {os.getloadavg()}; wrote {out}")
    return 0 if all(r["table"]["whole"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
