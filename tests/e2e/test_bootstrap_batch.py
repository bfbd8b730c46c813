"""The driver's bootstrap batch (handoff_spark.startup.bootstrap): a (re)started driver commits the backlog's first batch
in its own process, through the Spark write task's and commit's own functions, then Spark resumes from the
table's ledger. Real Kafka, a real SQLite Iceberg catalog and the real driver process (`python -m handoff_spark
run --available-now`); each drill ends with rows == distinct (partition, offset) == produced.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time

import pytest

from handoff_spark.iceberg import ledger
from handoff_spark.iceberg.sink import open_table
from handoff_testbed.eventually import eventually

from iceberg_drill_support import (PY, REPO, assert_exactly_once, drill_config, end_offsets, produce, run_app,
                                   run_to_completion)

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


def _stream_commits(cfg) -> list[ledger.Commit]:
    """The stream's ledger batches, oldest first."""
    return list(reversed(ledger.list_commits(open_table(cfg, create=False), cfg.handoff_id, query=cfg.query_name,
                                             include_markers=False)))


def _is_bootstrap(c: ledger.Commit) -> bool:
    return (c.query_id or "").startswith("bootstrap-")


def _assert_unbroken(commits: list[ledger.Commit]) -> None:
    """Every ledger batch starts where the one before it ended, per partition (nothing read twice or skipped)."""
    end: dict[tuple[str, int], int] = {}
    for c in commits:
        for topic, parts in c.offsets.items():
            for p, (start, stop) in parts.items():
                if (topic, p) in end and stop > start:
                    assert start == end[(topic, p)], (c, end)
                end[(topic, p)] = stop


def test_restart_with_backlog_commits_the_bootstrap_batch_then_spark_continues(kafka, tmp_path):
    topic = "bootstrap-restart"
    kafka.create_topic(topic, partitions=3)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, max_records=400)
    n = produce(kafka.bootstrap, topic, range(1500))
    first = run_to_completion(tmp_path, max_runs=1)
    n += produce(kafka.bootstrap, topic, range(1500, 2700))  # the backlog a restarted driver finds
    second = run_to_completion(tmp_path, max_runs=1)
    table = assert_exactly_once(cfg, kafka.bootstrap, n, topic)

    commits = _stream_commits(cfg)
    _assert_unbroken(commits)
    boots = [c for c in commits if _is_bootstrap(c)]
    assert len(boots) == 2  # one per driver start
    # each driver's first commit is its bootstrap batch: batch 0 of its own query, maxRecordsPerBatch offsets
    for boot in boots:
        assert boot.batch_id == 0 and boot.rows == 400
        assert sum(e - s for parts in boot.offsets.values() for s, e in parts.values()) == 400
        i = commits.index(boot)
        assert i + 1 < len(commits) and not _is_bootstrap(commits[i + 1])  # then Spark's batches
        assert commits[i + 1].batch_id == 0  # Spark's fresh query (its checkpoint was reset) starts at batch 0
    assert commits[0] == boots[0]
    # the second start's bootstrap began where the first driver's last commit ended
    before = commits[commits.index(boots[1]) - 1]
    assert {t: {p: se[0] for p, se in parts.items()} for t, parts in boots[1].offsets.items()} == before.end_offsets
    for run in (*first, *second):
        log = run.log.read_text()
        assert "bootstrap batch 0: 400 rows" in log
        assert "bootstrap batch committed" in log
        assert "discarded" not in log  # the reset after a bootstrap is no disagreement
    assert len(table.scan().to_arrow()) == n


def test_a_running_stream_keeps_committing_while_spark_starts_then_hands_over(kafka, tmp_path):
    """A running stream (no AvailableNow): the driver's bootstrap batches follow each other — back to back while
    the backlog exceeds a batch, then at the trigger interval — while the Spark session starts and runs its warm-up
    query (handoff_spark.startup.session_warmup), and stop at a batch boundary when Spark's query takes over from the
    ledger's end. Records keep arriving all along; SIGTERM then stops the stream at a batch boundary."""
    topic = "bootstrap-stream"
    kafka.create_topic(topic, partitions=2)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, max_records=300, triggerIntervalSeconds=1)
    produced = [produce(kafka.bootstrap, topic, range(700))]  # more than two batches' worth waits at the start
    stop = threading.Event()

    def producer() -> None:
        i = 700
        while not stop.is_set():
            produced.append(produce(kafka.bootstrap, topic, range(i, i + 50)))
            i += 50
            stop.wait(0.5)

    feeder = threading.Thread(target=producer, daemon=True)
    feeder.start()
    log = tmp_path / "stream.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "spark_app"), str(REPO / "hack")]),
           "PYSPARK_PYTHON": PY, "PYSPARK_DRIVER_PYTHON": PY}
    with log.open("w") as fh:
        proc = subprocess.Popen([PY, "-m", "handoff_spark", "run", "--config", str(tmp_path / "app.json")],
                                stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=tmp_path)
    try:
        eventually(lambda: re.search(r"^batch \d+: ", log.read_text(), re.M), "a batch of Spark's query", timeout=300,
                   interval=0.3, context=lambda: log.read_text()[-4000:])
        stop.set()
        feeder.join(timeout=30)
        rows = lambda: len(open_table(cfg, create=False).scan(selected_fields=("id",)).to_arrow())  # noqa: E731
        eventually(lambda: rows() == sum(produced), "every record committed", timeout=120, interval=0.3,
                   context=lambda: log.read_text()[-4000:])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()[-4000:]
    finally:
        stop.set()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert_exactly_once(cfg, kafka.bootstrap, sum(produced), topic)
    commits = _stream_commits(cfg)
    _assert_unbroken(commits)
    boots = [c for c in commits if _is_bootstrap(c)]
    assert len(boots) >= 3, text[-4000:]  # two capped batches for the backlog, then what arrived meanwhile
    assert commits[:len(boots)] == boots  # all before Spark's first
    assert len({c.query_id for c in boots}) == 1 and [c.batch_id for c in boots] == list(range(len(boots)))
    assert [c.rows for c in boots[:2]] == [300, 300]
    first_spark = commits[len(boots)]
    # Spark's fresh query, from the ledger's end after the last bootstrap batch. Its batch 0 runs even when nothing
    # arrived since that batch (Spark runs a fresh query's first batch whatever it holds) and then commits nothing
    # (CI saw it under load): the first committed batch is then 1, after an empty batch 0.
    assert first_spark.batch_id == 0 or (first_spark.batch_id == 1 and re.search(r"^batch 0: 0 rows", text, re.M)), \
        text[-4000:]
    assert {t: {p: se[0] for p, se in parts.items()} for t, parts in first_spark.offsets.items()} \
        == boots[-1].end_offsets
    assert re.search(r"session warm-up done in [0-9.]+ s", text), text[-4000:]
    assert text.count("bootstrap batch committed") == 1  # the checkpoint is reset once, after the first
    assert "discarded" not in text


def test_kill_right_after_the_bootstrap_commit(kafka, tmp_path):
    """kill -9 of the whole app just after the bootstrap's table commit, before the checkpoint is reset: the next
    driver finds a checkpoint behind the ledger, discards it (the existing rule) and goes on from the ledger."""
    topic = "bootstrap-kill"
    kafka.create_topic(topic, partitions=2)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, max_records=300)
    n = produce(kafka.bootstrap, topic, range(900))
    run_to_completion(tmp_path, max_runs=1)
    n += produce(kafka.bootstrap, topic, range(900, 1800))
    marker = tmp_path / "fault-fired"
    killed = run_app(tmp_path, env={"HANDOFF_FAULT": f"bootstrap-crash-after-table-commit:batch=0,once={marker}"})
    assert killed.returncode == -9 and marker.exists()
    commits = _stream_commits(cfg)
    assert _is_bootstrap(commits[-1])  # the bootstrap landed; Spark never ran in that driver
    runs = run_to_completion(tmp_path, max_runs=1)
    log = runs[0].log.read_text()
    assert "disagrees with the table's ledger and is discarded" in log
    assert "bootstrap batch committed" in log
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)
    _assert_unbroken(_stream_commits(cfg))


def test_lost_checkpoint_bootstraps_from_the_ledger(kafka, tmp_path):
    topic = "bootstrap-lost-ckpt"
    kafka.create_topic(topic, partitions=3)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, max_records=500)
    n = produce(kafka.bootstrap, topic, range(1200))
    run_to_completion(tmp_path, max_runs=1)
    end_before = ledger.resume_offsets(open_table(cfg, create=False), handoff_id=cfg.handoff_id)
    shutil.rmtree(tmp_path / "checkpoint")  # a lost PVC
    n += produce(kafka.bootstrap, topic, range(1200, 2400))
    run_to_completion(tmp_path, max_runs=1)
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)
    commits = _stream_commits(cfg)
    _assert_unbroken(commits)
    boot = [c for c in commits if _is_bootstrap(c)][-1]
    assert {t: {p: se[0] for p, se in parts.items()} for t, parts in boot.offsets.items()} == end_before


def test_bootstrap_off_keeps_sparks_path(kafka, tmp_path):
    topic = "bootstrap-off"
    kafka.create_topic(topic, partitions=2)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, bootstrapBatch=False)
    n = produce(kafka.bootstrap, topic, range(800))
    runs = run_to_completion(tmp_path, max_runs=1, env={"HANDOFF_BOOTSTRAP_BATCH": "1"})
    log = runs[0].log.read_text()
    assert "bootstrap batch off: bootstrapBatch is false" in log and "bootstrap batch 0" not in log
    assert_exactly_once(cfg, kafka.bootstrap, n, topic)
    assert not any(_is_bootstrap(c) for c in _stream_commits(cfg))


def test_bootstrap_refuses_when_another_writer_moved_the_ledger(kafka, tmp_path):
    """Another writer (a zombie driver; here a gap marker) moves the ledger between the bootstrap's plan and its
    commit: the ledger check refuses, the driver says so in one line and exits 1, nothing of the batch is in the
    table; the next driver resumes from the ledger as the other writer left it."""
    topic = "bootstrap-refused"
    kafka.create_topic(topic, partitions=1)
    cfg = drill_config(tmp_path, kafka.bootstrap, topic, max_records=250)
    n = produce(kafka.bootstrap, topic, range(500))
    run_to_completion(tmp_path, max_runs=1)
    n += produce(kafka.bootstrap, topic, range(500, 1000))
    release = tmp_path / "release"

    def other_writer() -> None:
        waiting = tmp_path / "release.waiting"
        while not waiting.exists():  # the driver has planned its bootstrap from the ledger's end (500)
            time.sleep(0.1)
        ledger.record_gap(open_table(cfg, create=False), cfg.handoff_id, cfg.query_name, {topic: {"0": [500, 505]}},
                          "test: another writer moved the ledger")
        release.touch()

    writer = threading.Thread(target=other_writer, daemon=True)
    writer.start()
    refused = run_app(tmp_path, env={"HANDOFF_FAULT": f"bootstrap-pause:release={release}"})
    writer.join(timeout=60)
    log = refused.log.read_text()
    assert refused.returncode == 1, log[-3000:]
    assert ("bootstrap batch failed: batch 0 of handoff drills/bootstrap-refused is "
            "not committed: bootstrap-refused[0] starts at 500 but the table already holds offsets up to 505") in log
    assert "started (run" not in log  # Spark's query never started
    newest = ledger.list_commits(open_table(cfg, create=False), cfg.handoff_id)[0]
    assert newest.kind == ledger.GAP
    run_to_completion(tmp_path, max_runs=1)
    rows = open_table(cfg, create=False).scan().to_arrow()
    offsets = rows["_kafka_offset"].to_pylist()
    assert len(offsets) == len(set(offsets)) == n - 5
    assert not set(offsets) & set(range(500, 505))
    assert ledger.resume_offsets(open_table(cfg, create=False))[topic] == end_offsets(kafka.bootstrap, topic)
