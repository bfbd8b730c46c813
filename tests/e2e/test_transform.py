"""Spark carries the records (issue 31): a SQL transform, a business-key dedupe and event time, run by Spark on the
DataFrame path (`sink.frames` → `driver.transform` → the Iceberg rows writer), on the real broker and the real
driver process, kill -9 included.

Every drill ends exact: the table holds each produced order that passes the filter and is not late exactly once
(no business-key duplicate), the late ones are dead letters with reason `late`, the ledger's ranges end at the
topic's end, and its counts add up (rows + dead letters + dropped == records read)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from handoff_spark.iceberg import ledger
from handoff_spark.iceberg.sink import open_table

from iceberg_drill_support import drill_config, end_offsets, run_app, run_to_completion
from transform_drill_support import (COLUMNS, POISON_IDS, POISON_SQL, SQL, dead_letters, first_phase, order,
                                     poisoned_orders, produce)

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


def config(tmp_path, kafka, topic: str, **over: Any):
    kafka.create_topic(topic + "-dlq", partitions=1)
    fields: dict[str, Any] = {"transform": {"sql": SQL}, "dedupe": {"keys": ["id"], "withinSeconds": 3600},
                              "eventTime": {"column": "ts", "watermarkSeconds": 3600}, **over}
    return drill_config(tmp_path, kafka.bootstrap, topic, columns=COLUMNS, max_records=300,
                        deadLetterTopic=topic + "-dlq", **fields)


def check_table(cfg, kafka, topic: str, expected_ids: set[int], produced: int) -> list[Any]:
    table = open_table(cfg, create=False)
    data = table.scan().to_arrow()
    ids = data["id"].to_pylist()
    assert len(ids) == len(set(ids)), "a business-key duplicate reached the table"
    assert set(ids) == expected_ids
    assert set(data["customer"].to_pylist()) <= {f"C{k}" for k in range(7)}  # the SQL's derived column
    commits = ledger.list_commits(table)
    assert commits[0].end_offsets[topic] == end_offsets(kafka.bootstrap, topic)
    props = [table.snapshot_by_id(c.snapshot_id).summary.additional_properties for c in commits]
    rows = sum(int(p["handoff.rows"]) for p in props)
    dlq = sum(int(p["handoff.dlq-rows"]) for p in props)
    dropped = sum(int(p["handoff.dropped-rows"]) for p in props)
    assert rows == len(ids)
    assert rows + dlq + dropped == produced, (rows, dlq, dropped, produced)
    return props


def test_transform_dedupe_and_late_records_through_spark_with_a_kill9(kafka, tmp_path):
    topic = "tx-orders"
    kafka.create_topic(topic, partitions=2)
    cfg = config(tmp_path, kafka, topic, sparkConf={"spark.master": "local[2]"})
    phase1 = first_phase(1200)
    produce(kafka.bootstrap, topic, phase1)
    runs = run_to_completion(tmp_path, kill_after_commits=2, cfg=cfg)
    assert runs[0].returncode == -9 and runs[-1].returncode == 0
    log = "".join(r.log.read_text() for r in runs)
    assert "bootstrap" not in [line.split()[0] for line in log.splitlines() if line.strip()]  # Spark's batches only
    # late: 40 new orders ten hours older than the newest; duplicates of recent orders, newer than the first copy
    late = [order(5000 + i, 1200 - 600 - i) for i in range(40)]
    fresh = [order(1200 + i, 1200 + i) for i in range(100)]
    again = [order(i, 1050 + i) for i in range(1150, 1200)]  # re-sent within the hour's window: dropped
    produce(kafka.bootstrap, topic, late + fresh + again)
    run_to_completion(tmp_path, max_runs=1)
    produced = len(phase1) + len(late) + len(fresh) + len(again)
    expected = {i for i in range(1300) if i % 20 >= 5}
    check_table(cfg, kafka, topic, expected, produced)
    dead = dead_letters(kafka.bootstrap, topic + "-dlq")
    assert sorted(o["id"] for o, _ in dead) == [5000 + i for i in range(40)]
    assert {reason for _, reason in dead} == {"late"}
    # A local master's shuffle has one partition per core (app.frame_path_conf): the dedupe's state is two stores
    # here, not a cluster's eight, and the offset log keeps that number for the query's later starts.
    state = tmp_path / "checkpoint" / "state" / "0"
    assert sorted(p.name for p in state.iterdir() if p.name.isdigit()) == ["0", "1"]
    offsets = tmp_path / "checkpoint" / "offsets"
    last = max((f for f in offsets.iterdir() if f.name.isdigit()), key=lambda f: int(f.name))
    assert '"spark.sql.shuffle.partitions":"2"' in last.read_text()
    # The dedupe is the only state, so no batch ran without data (app.no_data_batches): each batch in the offset
    # log read past the one before it. With Spark's no-data batches, each run would end with one whose offsets
    # repeat the batch before (the watermark moved: an eviction-only batch).
    ends = [f.read_text().splitlines()[2:] for f in sorted((f for f in offsets.iterdir() if f.name.isdigit()),
                                                            key=lambda f: int(f.name))]
    assert len(ends) >= 2 and all(a != b for a, b in zip(ends, ends[1:])), ends


def test_bad_sql_refuses_the_start_in_one_line_and_writes_nothing(kafka, tmp_path):
    topic = "tx-bad-sql"
    kafka.create_topic(topic, partitions=1)
    cfg = config(tmp_path, kafka, topic, transform={"sql": "SELECT id, nope FROM source"})
    produce(kafka.bootstrap, topic, [order(i, i) for i in range(50)])
    run = run_app(tmp_path, cfg=cfg, timeout=180)
    assert run.returncode == 3
    text = run.log.read_text()
    lines = [line for line in text.splitlines() if line.startswith("TransformInvalid:")]
    assert len(lines) == 1 and lines[0].startswith("TransformInvalid: spec.transform.sql:") and "nope" in lines[0]
    assert "Traceback" not in text and "Py4JJavaError" not in text  # a user's mistake is one line
    table = open_table(cfg, create=False)
    assert table.current_snapshot() is None


def test_a_non_deterministic_transform_is_refused(kafka, tmp_path):
    topic = "tx-rand"
    kafka.create_topic(topic, partitions=1)
    cfg = config(tmp_path, kafka, topic, transform={"sql": SQL.replace("WHERE amount >= 5", "WHERE rand() < 0.5")})
    run = run_app(tmp_path, cfg=cfg, timeout=180)
    assert run.returncode == 3
    lines = [line for line in run.log.read_text().splitlines() if line.startswith("TransformInvalid:")]
    assert len(lines) == 1 and "non-deterministic" in lines[0], lines


def test_a_transform_missing_the_kafka_columns_is_refused_with_the_fix(kafka, tmp_path):
    topic = "tx-no-kafka-cols"
    kafka.create_topic(topic, partitions=1)
    cfg = config(tmp_path, kafka, topic, transform={"sql": "SELECT id, ts, customer, amount, region FROM source"})
    run = run_app(tmp_path, cfg=cfg, timeout=180)
    assert run.returncode == 3
    lines = [line for line in run.log.read_text().splitlines() if line.startswith("TransformInvalid:")]
    assert len(lines) == 1 and "lacks _kafka_topic" in lines[0] and "SELECT *" in lines[0], lines


def test_a_record_the_sql_fails_on_is_a_dead_letter_and_the_stream_goes_on(kafka, tmp_path):
    """Under ANSI SQL (Spark's default) a malformed value fails the cast, so the task, so the query: the driver
    finds the record by halving the failed batch, sends it to the dead letters and starts the query again."""
    topic = "tx-poison"
    kafka.create_topic(topic, partitions=2)
    cfg = config(tmp_path, kafka, topic, transform={"sql": POISON_SQL})
    orders = poisoned_orders(600)
    produce(kafka.bootstrap, topic, orders)
    runs = run_to_completion(tmp_path, max_runs=1, cfg=cfg)
    log = runs[0].log.read_text()
    assert "the transform failed on" in log and "restarted after a quarantine" in log
    expected = {i for i in range(600) if i % 20 >= 5} - POISON_IDS
    check_table(cfg, kafka, topic, expected, len(orders))
    dead = dead_letters(kafka.bootstrap, topic + "-dlq")
    assert sorted(o["id"] for o, _ in dead) == sorted(POISON_IDS)
    assert {reason for _, reason in dead} == {"transform-error"}


def test_rows_the_sql_leaves_without_their_required_dedupe_key_are_each_a_dead_letter_not_one_key(kafka, tmp_path):
    """Spark's dedupe takes null for a key like any other (as SQL's DISTINCT does): rows whose required key `id` the
    SQL left null would be one key, the first kept and every later one dropped as its duplicate. Each of them is a
    record the transform fails on instead: a dead letter with reason `transform-error`, the stream going on."""
    topic = "tx-null-key"
    kafka.create_topic(topic, partitions=2)
    sql = SQL.replace("SELECT id,", "SELECT CASE WHEN id IN (77, 305, 306) THEN NULL ELSE id END AS id,")
    cfg = config(tmp_path, kafka, topic, transform={"sql": sql})
    orders = [order(i, i) for i in range(600)]
    produce(kafka.bootstrap, topic, orders)
    runs = run_to_completion(tmp_path, max_runs=1, cfg=cfg)
    assert "restarted after a quarantine" in runs[0].log.read_text()
    check_table(cfg, kafka, topic, {i for i in range(600) if i % 20 >= 5} - POISON_IDS, len(orders))
    dead = dead_letters(kafka.bootstrap, topic + "-dlq")
    assert sorted(o["id"] for o, _ in dead) == sorted(POISON_IDS)
    assert {reason for _, reason in dead} == {"transform-error"}


def test_a_lost_checkpoint_keeps_the_dedupe_window(kafka, tmp_path):
    """The table's ledger is the truth: with the checkpoint (and Spark's dedupe state in it) gone, the driver
    rebuilds the window from the records the ledger says are within it before it reads new ones, so keys re-sent
    within the window are still dropped, and nothing already in the table is written again."""
    import shutil

    topic = "tx-lost-checkpoint"
    kafka.create_topic(topic, partitions=2)
    cfg = config(tmp_path, kafka, topic)
    phase1 = first_phase(600)
    produce(kafka.bootstrap, topic, phase1)
    run_to_completion(tmp_path, max_runs=1)
    shutil.rmtree(tmp_path / "checkpoint")
    again = [order(i, 50 + i) for i in range(550, 600)]  # re-sent 50 minutes after the first copy: in the window
    fresh = [order(600 + i, 600 + i) for i in range(50)]
    produce(kafka.bootstrap, topic, again + fresh)
    runs = run_to_completion(tmp_path, max_runs=1)
    expected = {i for i in range(650) if i % 20 >= 5}
    check_table(cfg, kafka, topic, expected, len(phase1) + len(again) + len(fresh))
    assert "dedupe window rebuilt from Kafka" in runs[0].log.read_text()


def _a_start_after_a_change_of_the_dedupes_state(tmp_path, kafka, topic: str, change: Callable[[], Any]) -> str:
    """600 orders under the config written before; then `change()` writes the changed one and returns it, 50 orders
    are re-sent within the window and 50 new ones come, and one run takes them. The table must hold each order the
    SQL keeps once, and the window must have been rebuilt from the ledger. Returns that run's log."""
    phase1 = first_phase(600)
    produce(kafka.bootstrap, topic, phase1)
    run_to_completion(tmp_path, max_runs=1)
    cfg = change()
    again = [order(i, 50 + i) for i in range(550, 600)]  # re-sent within the window (same id, same region)
    fresh = [order(600 + i, 600 + i) for i in range(50)]
    produce(kafka.bootstrap, topic, again + fresh)
    log = run_to_completion(tmp_path, max_runs=1)[0].log.read_text()
    check_table(cfg, kafka, topic, {i for i in range(650) if i % 20 >= 5}, len(phase1) + len(again) + len(fresh))
    assert "dedupe window rebuilt from Kafka" in log, log[-3000:]
    return log


def test_changed_dedupe_keys_rebuild_the_window_from_the_ledger_instead_of_failing_on_the_old_state(kafka, tmp_path):
    """Spark's dedupe state in the checkpoint is keyed by the old `dedupe.keys`, and Spark refuses a state whose
    key schema changed. The checkpoint is a cache: the driver discards it, says why, and rebuilds the window for the
    new keys from the records the ledger committed, so the stream goes on and keys re-sent within the window are
    still dropped."""
    topic = "tx-dedupe-keys"
    kafka.create_topic(topic, partitions=2)
    config(tmp_path, kafka, topic)
    log = _a_start_after_a_change_of_the_dedupes_state(tmp_path, kafka, topic, lambda: drill_config(
        tmp_path, kafka.bootstrap, topic, columns=COLUMNS, max_records=300, deadLetterTopic=topic + "-dlq",
        transform={"sql": SQL}, dedupe={"keys": ["id", "region"], "withinSeconds": 3600},
        eventTime={"column": "ts", "watermarkSeconds": 3600}))
    assert "dedupe.keys changed from [id] to [id, region]" in log, log[-3000:]


def test_a_dedupe_key_widened_under_the_same_name_rebuilds_the_window_instead_of_failing_on_the_old_state(
        kafka, tmp_path):
    """A key's name is not all of Spark's state key: a derived key `okey` widened from int to bigint (the SQL's CAST
    and its declared type, which the table widens) keeps the name, and Spark refuses the old state for it. The driver
    records the keys' types with the checkpoint once Spark has planned the SQL, discards the checkpoint when they
    changed, and rebuilds the window from the ledger: re-sent orders are still dropped, the stream goes on."""
    topic = "tx-dedupe-key-type"
    kafka.create_topic(topic, partitions=2)

    def okey_config(spark_type: str, declared: str):
        sql = SQL.replace("SELECT id,", f"SELECT id, CAST(id AS {spark_type}) AS okey,")
        return drill_config(tmp_path, kafka.bootstrap, topic, columns=[*COLUMNS, {"name": "okey", "type": declared}],
                            max_records=300, deadLetterTopic=topic + "-dlq", transform={"sql": sql},
                            dedupe={"keys": ["okey"], "withinSeconds": 3600},
                            eventTime={"column": "ts", "watermarkSeconds": 3600})
    kafka.create_topic(topic + "-dlq", partitions=1)
    okey_config("INT", "int")
    log = _a_start_after_a_change_of_the_dedupes_state(tmp_path, kafka, topic, lambda: okey_config("BIGINT", "long"))
    assert "dedupe key types changed: okey from int to bigint" in log, log[-3000:]


def test_a_lookup_joins_the_catalogs_table_and_its_new_content_after_it_changes(kafka, tmp_path):
    """Enrichment: the SQL joins a table of the handoff's catalog; when that table changes, the running driver
    restarts its query (same session, same checkpoint) and the next batches join the new content."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import pyarrow as pa

    from handoff_spark.iceberg.table import load_catalog_cached
    from iceberg_drill_support import REPO

    topic = "tx-lookup"
    kafka.create_topic(topic, partitions=1)
    sql = ("SELECT s.id, s.ts, c.segment AS customer, s.amount, s.region, s._kafka_topic, s._kafka_partition, "
           "s._kafka_offset, s._kafka_timestamp FROM source s JOIN customers c ON s.customer = c.customer")
    cfg = config(tmp_path, kafka, topic, transform={"sql": sql, "lookups": [{"name": "customers",
                                                                              "table": "crm.customers"}]},
                 dedupe=None, eventTime=None, triggerIntervalSeconds=1)
    catalog = load_catalog_cached(cfg.sink.catalog_name, cfg.sink.catalog_properties)
    catalog.create_namespace_if_not_exists("crm")
    customers = pa.table({"customer": [f"c{k}" for k in range(7)], "segment": ["gold"] * 7})
    catalog.create_table("crm.customers", schema=customers.schema).append(customers)
    produce(kafka.bootstrap, topic, [order(i, i) for i in range(100)])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "spark_app"), str(REPO / "hack")])}
    log = tmp_path / "lookup.log"
    with log.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "handoff_spark", "run", "--config", str(tmp_path / "app.json")],
                                stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=tmp_path)
    try:
        def rows() -> list[dict[str, Any]]:
            try:
                return open_table(cfg, create=False).scan().to_arrow().to_pylist()
            except Exception:  # noqa: BLE001 - not created yet
                return []

        def until(check, what: str, timeout: float = 180) -> None:
            deadline = time.monotonic() + timeout
            while not check():
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, f"no {what}: " + log.read_text()[-3000:]
                time.sleep(0.5)

        until(lambda: len(rows()) == 100, "first rows")
        assert {r["customer"] for r in rows()} == {"gold"}
        catalog.load_table("crm.customers").overwrite(pa.table({"customer": [f"c{k}" for k in range(7)],
                                                                "segment": ["platinum"] * 7}))
        until(lambda: "restarted with the lookups' new content" in log.read_text(), "restart")
        produce(kafka.bootstrap, topic, [order(i, i) for i in range(100, 150)])
        until(lambda: len(rows()) == 150, "rows after the change")
        by_id = {r["id"]: r["customer"] for r in rows()}
        assert {by_id[i] for i in range(100)} == {"gold"} and {by_id[i] for i in range(100, 150)} == {"platinum"}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def test_a_row_the_transform_leaves_without_a_required_value_is_a_dead_letter(kafka, tmp_path):
    """`id` is required; the SQL nulls it for two orders: those rows are dead letters (the row as JSON), the batch
    commits the rest, and the ledger's counts still add up."""
    topic = "tx-required-null"
    kafka.create_topic(topic, partitions=1)
    sql = SQL.replace("SELECT id,", "SELECT CASE WHEN id IN (77, 88) THEN NULL ELSE id END AS id,")
    cfg = config(tmp_path, kafka, topic, transform={"sql": sql}, dedupe=None, eventTime=None)
    orders = [order(i, i) for i in range(200)]
    produce(kafka.bootstrap, topic, orders)
    run_to_completion(tmp_path, max_runs=1, cfg=cfg)
    check_table(cfg, kafka, topic, {i for i in range(200) if i % 20 >= 5} - {77, 88}, len(orders))
    dead = dead_letters(kafka.bootstrap, topic + "-dlq")
    assert sorted(o["_kafka_offset"] for o, _ in dead) == [77, 88]
    assert {reason for _, reason in dead} == {"missing-required"}
