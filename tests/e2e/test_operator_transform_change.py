"""A changed transform, dedupe or pace restarts the query in the running driver, not the driver (issue 31, "restart the
query inside the running driver instead of the JVM"): the operator (in-process, real kube-apiserver) renders the new
query config into the progress ConfigMap's query-config annotation and leaves the driver's pod template as it was; a
real driver process (`python -m handoff_spark run`, Spark local mode; the test plays the kubelet and the Deployment's
Recreate rollout, replay_drill_support.Kubelet) checks it, stops its query at a batch boundary and starts it again
with it. A SQL that fails the check is refused: the query runs on with the SQL before. New dedupe keys no longer fit
Spark's state in the checkpoint: the start is planned again in the driver, the checkpoint discarded and the window
rebuilt from the ledger. Real Kafka, a real Iceberg table in a SQLite catalog; the second drill runs a new SQL and a
refused one into a BigQuery table of the test bed's emulator; the third starts a handoff without a transform (the
fused path) and adds a transform and a dedupe, then removes them, each in the same driver process.

Done when: one driver process ran through the five changes (no new pod template, no restart), every record is in
the table exactly once, the records produced after the driver said it runs a new SQL carry its derivation and those
before the old one's, those after a new batch size came in batches of that size, the refused SQL left the stream running with the SQL before it, and a driver killed and
started from an older mounted app config runs the operator's newest config. A declared column added (and read by the
SQL) reaches the table from the same driver, on both sinks; a schema the Iceberg table cannot take is refused in that
driver, the operator rolls it back with reason SchemaIncompatible, and the stream goes on. A new dead-letter topic
(and replay window) runs in the same driver too: the next dead letter lands in the new topic."""
from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest
from confluent_kafka import Producer

from handoff_spark.config import AppConfig
from handoff_spark.contract import CONFIG_HASH_KEY, CONFIG_REFUSED_HASH_KEY, CONFIG_REFUSED_KEY, CONFIG_SINCE_KEY
from handoff_spark.iceberg import ledger
from handoff_spark.kafka.offsets import committed_group_offsets
from operator_support import Cluster, eventually
from replay_drill_support import (bigquery_rows, bigquery_spec, committed_to, end_offsets, iceberg_spec, local_handoff,
                                  produce)
from transform_drill_support import dead_letters

pytestmark = [pytest.mark.e2e, pytest.mark.apiserver, pytest.mark.kafka]

KAFKA_COLUMNS = "_kafka_topic, _kafka_partition, _kafka_offset, _kafka_timestamp"
SQL_V1 = f"SELECT id, ts, region, {KAFKA_COLUMNS} FROM source"
SQL_V2 = f"SELECT id, ts, upper(region) AS region, {KAFKA_COLUMNS} FROM source"
SQL_BAD = f"SELECT id, ts, nope AS region, {KAFKA_COLUMNS} FROM source"
SQL_V3 = f"SELECT id, ts, concat(region, '3') AS region, {KAFKA_COLUMNS} FROM source"
SQL_NOTE = f"SELECT id, ts, concat(region, '3') AS region, note, {KAFKA_COLUMNS} FROM source"


def _rows(cfg: AppConfig) -> list[tuple[int, int, int, str]]:
    sink = cfg.sink
    table = ledger.load_table(sink.catalog_name, dict(sink.catalog_properties), sink.table)  # type: ignore[union-attr]
    data = table.scan(selected_fields=("_kafka_partition", "_kafka_offset", "id", "region")).to_arrow()
    return sorted(zip(data["_kafka_partition"].to_pylist(), data["_kafka_offset"].to_pylist(),
                      data["id"].to_pylist(), data["region"].to_pylist()))


def _notes(cfg: AppConfig) -> dict[int, str | None]:
    """Each order's `note` in the table."""
    sink = cfg.sink
    table = ledger.load_table(sink.catalog_name, dict(sink.catalog_properties), sink.table)  # type: ignore[union-attr]
    data = table.scan(selected_fields=("id", "note")).to_arrow()
    return dict(zip(data["id"].to_pylist(), data["note"].to_pylist()))


def _batch_sizes_from(cfg: AppConfig, topic: str, start: dict[int, int]) -> list[int]:
    """The records of each ledger batch that begins at or after `start` on every partition of `topic`."""
    sink = cfg.sink
    table = ledger.load_table(sink.catalog_name, dict(sink.catalog_properties), sink.table)  # type: ignore[union-attr]
    sizes = []
    for commit in ledger.list_commits(table, cfg.handoff_id, include_markers=False):
        ranges = commit.offsets.get(topic, {})
        if ranges and all(se[0] >= start.get(int(p), 0) for p, se in ranges.items()):
            sizes.append(sum(se[1] - se[0] for se in ranges.values()))
    return sizes


def _record(cluster: Cluster, ns: str) -> dict[str, Any]:
    """The driver's published progress record (what the operator reads)."""
    cm = cluster.core.read_namespaced_config_map("orders-progress", ns)
    return json.loads((cm.data or {}).get("progress.json") or "{}")


def _wanted_hash(cluster: Cluster, ns: str) -> str:
    """The config hash of the transform the operator wants run now (its query-config annotation)."""
    cm = cluster.core.read_namespaced_config_map("orders-progress", ns)
    return json.loads(cm.metadata.annotations["handoff.io/query-config"])["configHash"]


def _changed(cluster: Cluster, ns: str, patch: dict[str, Any], seen: list[str], what: str) -> str:
    """`patch` applied to the handoff; the operator's query config for it (a hash not in `seen`, then added)."""
    cluster.patch_spec(ns, "orders", patch)
    config = eventually(lambda: (h := _wanted_hash(cluster, ns)) not in seen and h, f"the query config of {what}")
    seen.append(config)
    return config


def _running(cluster: Cluster, ns: str, key: str, config: str, what: str, timeout: float = 120) -> dict[str, Any]:
    """The driver's record once its `key` (the config it runs, or the one it refused) is `config`."""
    return eventually(lambda: (r := _record(cluster, ns)).get(key) == config and r, what, timeout=timeout)


def _committed(kafka: Any, cfg: AppConfig, topic: str, ids: range, what: str, timeout: float = 180) -> None:
    """Orders `ids` produced, and the table's ledger past them."""
    produce(kafka.bootstrap, topic, ids)
    ends = end_offsets(kafka.bootstrap, topic)
    eventually(lambda: committed_to(cfg, topic, ends), what, timeout=timeout)


def _marked_good(cluster: Cluster, ns: str, config: str, what: str) -> None:
    """The operator has seen `config` commit: the spec a refused change is rolled back to. (Applying the next change
    before that is the race the upgrade rule's tried copy covers, tests/integration/operator/upgrade; these drills
    change one thing after another, as a user watching the status does.)"""
    eventually(lambda: ((cluster.get(ns, "orders").get("status") or {}).get("upgrade") or {})
               .get("lastGoodConfigHash") == config, f"{what} marked good", timeout=120)


def _new_sql_then_a_bad_one(cluster: Cluster, ns: str, kafka: Any, cfg: AppConfig, topic: str, seen: list[str],
                            after_new: range, after_bad: range, *, operator_reads_the_driver: bool = False
                            ) -> tuple[str, str, dict[str, Any]]:
    """Both drills' first changes: SQL_V2 runs (orders `after_new` committed with it), then SQL_BAD is refused and
    the stream goes on with SQL_V2 (orders `after_bad` committed). The two configs and the refusing record.
    `operator_reads_the_driver`: the driver publishes its pod's name, so the operator marks SQL_V2 good (waited for)
    and rolls the refused one back to it."""
    v2 = _changed(cluster, ns, {"transform": {"sql": SQL_V2}}, seen, "the new SQL")
    _running(cluster, ns, CONFIG_HASH_KEY, v2, "the driver running the new SQL")
    _committed(kafka, cfg, topic, after_new, "the records after the change committed")
    if operator_reads_the_driver:
        _marked_good(cluster, ns, v2, "the new SQL")
    bad = _changed(cluster, ns, {"transform": {"sql": SQL_BAD}}, seen, "the bad SQL")
    record = _running(cluster, ns, CONFIG_REFUSED_HASH_KEY, bad, "the driver refusing the bad SQL")
    assert record[CONFIG_HASH_KEY] == v2, record
    _committed(kafka, cfg, topic, after_bad, "the stream going on with the SQL before")
    return v2, bad, record


def _a_noted_column(cluster: Cluster, ns: str, kafka: Any, cfg: AppConfig, topic: str, spec: dict[str, Any],
                    seen: list[str], sql: str, ids: range) -> tuple[list[dict[str, Any]], str]:
    """A declared column `note` added and read by `sql`, run by the driver; orders `ids` produced with a note and
    committed. The new columns and the config."""
    columns = spec["schema"]["columns"] + [{"name": "note", "type": "string"}]
    noted = _changed(cluster, ns, {"schema": {"columns": columns}, "transform": {"sql": sql}}, seen, "a new column")
    _running(cluster, ns, CONFIG_HASH_KEY, noted, "the driver running the new column")
    produce(kafka.bootstrap, topic, ids, note=True)
    ends = end_offsets(kafka.bootstrap, topic)
    eventually(lambda: committed_to(cfg, topic, ends), "the noted orders committed", timeout=180)
    return columns, noted


def _one_driver(kubelet: Any, restarts: int, what: str) -> str:
    """The driver's log, once it is certain one process under one pod template ran through `what`, restarting its
    query `restarts` times for the operator's query configs."""
    assert kubelet.starts == 1 and len(set(kubelet.templates)) == 1, (
        f"one driver process, one pod template, through {what}" + kubelet.crashes())
    logs = kubelet.logs()
    assert logs.count("restarted with the operator's query config") == restarts, logs[-3000:]
    return logs


def _each_order_once_as_derived(rows: list[tuple[int, int, int, str]], total: int,
                                derived: list[tuple[range, Callable[[str], str], str]]) -> None:
    """The table holds orders 0..total-1 once each, at distinct Kafka offsets, and each span of orders carries the
    region its SQL derived (the span, the derivation from the produced region, the SQL's name)."""
    assert len(rows) == len({(p, o) for p, o, _i, _r in rows}) == total
    assert sorted(i for _p, _o, i, _r in rows) == list(range(total))
    regions = {i: r for _p, _o, i, r in rows}
    for ids, derive, sql in derived:
        assert all(regions[i] == derive(["eu", "us", "ap"][i % 3]) for i in ids), sql


def test_a_changed_transform_restarts_the_query_in_the_running_driver_and_a_bad_one_is_refused(
        cluster: Cluster, kafka, tmp_path: Path) -> None:
    topic = f"transform-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    kafka.create_topic(f"{topic}-dlq", partitions=1)
    produce(kafka.bootstrap, topic, range(0, 1000))
    ns = cluster.new_namespace("transform-e2e")
    spec = iceberg_spec(kafka.bootstrap, topic, tmp_path, "shop.transformed", transform={"sql": SQL_V1},
                        dedupe={"keys": ["id"], "within": "1h"}, deadLetter={"topic": f"{topic}-dlq"})
    # The driver publishes its pod's name: the operator reads what it runs and what it refused (the conditions and
    # the upgrade rule's rollback of a refused config).
    with local_handoff(cluster, ns, spec, tmp_path, kafka.bootstrap, topic, pod_name=True) as (kubelet, cfg):
        seen = [_wanted_hash(cluster, ns)]
        assert _record(cluster, ns).get(CONFIG_HASH_KEY) == seen[0], "the driver reports the config it runs"

        v2, bad, record = _new_sql_then_a_bad_one(cluster, ns, kafka, cfg, topic, seen, range(1000, 2000),
                                                  range(2000, 2300), operator_reads_the_driver=True)
        assert record[CONFIG_REFUSED_KEY].startswith("TransformInvalid: spec.transform.sql:"), record
        assert "nope" in record[CONFIG_REFUSED_KEY], record

        logs = _one_driver(kubelet, 1, "both changes")
        assert f"the operator's query config {bad} is refused; the query runs on with config {v2}" \
            in logs, logs[-3000:]

        # A fixed SQL, then the driver killed (-9) and started from the app config its pod mounted first: the kubelet
        # refreshes a mounted ConfigMap only after a while, so a restarted driver may read an old SQL there. It runs
        # the operator's newest (the annotation) instead, and says so.
        v3 = _changed(cluster, ns, {"transform": {"sql": SQL_V3}}, seen, "the fixed SQL")
        record = _running(cluster, ns, CONFIG_HASH_KEY, v3, "the driver running the fixed SQL")
        assert CONFIG_REFUSED_HASH_KEY not in record, record

        # Other dedupe keys: Spark's state in the checkpoint is keyed by the old ones, so the query's start is planned
        # again in the same driver (driver.resume): the checkpoint is discarded and the window rebuilt from the ledger.
        v4 = _changed(cluster, ns, {"dedupe": {"keys": ["id", "region"]}}, seen, "the new keys")
        _running(cluster, ns, CONFIG_HASH_KEY, v4, "the driver running the new keys")
        _committed(kafka, cfg, topic, range(2300, 2400), "the records after the new keys committed")
        assert kubelet.starts == 1 and len(set(kubelet.templates)) == 1, kubelet.crashes()
        logs = kubelet.logs()
        assert logs.count("restarted with the operator's query config") == 3, logs[-3000:]
        assert "dedupe.keys changed from [id] to [id, region]" in logs, logs[-3000:]

        crashed_ms = int(time.time() * 1000)
        kubelet.crash(restart_with=cfg)  # cfg: the app config the first process mounted (SQL_V1, keys [id])
        eventually(lambda: (r := _record(cluster, ns)).get(CONFIG_HASH_KEY) == v4
                   and r.get(CONFIG_SINCE_KEY, 0) > crashed_ms, "the new process running the newest config", timeout=300)
        _committed(kafka, cfg, topic, range(2400, 2500), "the records after the restart committed", timeout=300)
        assert kubelet.starts == 2, kubelet.crashes()
        assert f"running the operator's query config {v4} (newer than the pod's app config)" \
            in kubelet.logs(), kubelet.logs()[-3000:]

        # The query's pace (spec.commitInterval, spec.source.maxRecordsPerBatch) changes in the running driver too: the
        # next 300 records arrive in batches of at most 50 (400 before), committed by the second process.
        pace = _changed(cluster, ns, {"commitInterval": "2s", "source": {"maxRecordsPerBatch": 50}}, seen, "the pace")
        _running(cluster, ns, CONFIG_HASH_KEY, pace, "the driver running the new pace")
        before = end_offsets(kafka.bootstrap, topic)
        _committed(kafka, cfg, topic, range(2500, 2800), "the records at the new pace committed")
        sizes = _batch_sizes_from(cfg, topic, before)
        assert sum(sizes) == 300 and max(sizes) <= 50 and len(sizes) >= 6, sizes
        assert kubelet.starts == 2 and len(set(kubelet.templates)) == 1, kubelet.crashes()
        logs = kubelet.logs()
        assert logs.count("restarted with the operator's query config") == 4, logs[-3000:]
        # Only the new keys discarded the checkpoint: the restart from the old app config planned its start for the
        # operator's config (keys [id, region], what the checkpoint holds), and a new pace keeps the state.
        assert logs.count("holds Spark's dedupe state for other keys and is discarded") == 1, logs[-6000:]

        # A declared column added (spec.schema.columns) and read by the SQL: the same driver adds it to the table at
        # the batch boundary, as a start would, and its query reads it (orders 2800..2899 carry a note).
        columns, noted = _a_noted_column(cluster, ns, kafka, cfg, topic, spec, seen, SQL_NOTE, range(2800, 2900))
        _marked_good(cluster, ns, noted, "the new column")

        # A type the table's column cannot become (id: long → string): refused at the boundary in one line, the query
        # before started again in the same driver, and the operator goes back to the last good spec with the reason.
        retyped = [{**c, "type": "string"} if c["name"] == "id" else c for c in columns]
        refused = _changed(cluster, ns, {"schema": {"columns": retyped}}, seen, "an incompatible column type")
        upgrade = eventually(lambda: ((cluster.get(ns, "orders").get("status") or {}).get("upgrade") or {})
                             .get("rolledBackConfigHash") == refused and cluster.get(ns, "orders")["status"]["upgrade"],
                             "the incompatible schema rolled back", timeout=120,
                             context=lambda: f"status {cluster.get(ns, 'orders').get('status')}\nrecord "
                                             f"{_record(cluster, ns)}\n{kubelet.logs()[-4000:]}")
        assert upgrade["rolledBackReason"] == "SchemaIncompatible", upgrade
        _committed(kafka, cfg, topic, range(2900, 3000), "the stream going on with the schema before")
        assert kubelet.starts == 2 and len(set(kubelet.templates)) == 1, kubelet.crashes()
        logs = kubelet.logs()
        assert logs.count("restarted with the operator's query config") == 5, logs[-3000:]
        assert (f"the operator's query config {refused} is refused; the query runs on with config {noted}: "
                f"SchemaIncompatible: spec.schema:") in logs, logs[-3000:]
        assert f"restarted with config {noted}, the one it ran" in logs, logs[-3000:]

        _each_order_once_as_derived(_rows(cfg), 3000, [(range(1000), str, "before: the first SQL"),
                                                       (range(1000, 2300), str.upper, "after: the second"),
                                                       (range(2300, 3000), lambda r: r + "3", "after the fixed SQL")])
        notes = _notes(cfg)
        assert {i: n for i, n in notes.items() if n is not None} == {i: f"n{i}" for i in range(2800, 2900)}, notes

        # Another dead-letter topic and replay window (with the columns that run, and records that do not fit them
        # sent there rather than halting): the same driver's next query sends its dead letters to the new topic. An
        # order whose id is no number is one.
        moved_to = f"{topic}-dlq2"
        kafka.create_topic(moved_to, partitions=1)
        moved = _changed(cluster, ns, {"schema": {"columns": columns, "onIncompatible": "deadLetter"},
                                       "deadLetter": {"topic": moved_to}, "replay": {"window": "14d"}}, seen,
                         "the new dead-letter topic")
        _running(cluster, ns, CONFIG_HASH_KEY, moved, "the driver running the new dead-letter topic")
        bad = Producer({"bootstrap.servers": kafka.bootstrap})
        bad.produce(topic, key=b"bad", value=json.dumps({"id": "not-a-number", "region": "eu"}).encode())
        assert bad.flush(30) == 0
        _committed(kafka, cfg, topic, range(3000, 3050), "the records after the new dead-letter topic committed")
        assert [v.get("id") for v, _reason in dead_letters(kafka.bootstrap, moved_to)] == ["not-a-number"]
        assert "not-a-number" not in [v.get("id") for v, _reason in dead_letters(kafka.bootstrap, f"{topic}-dlq")]
        assert kubelet.starts == 2 and len(set(kubelet.templates)) == 1, kubelet.crashes()
        assert kubelet.logs().count("restarted with the operator's query config") == 6, kubelet.logs()[-3000:]
        assert sorted(i for _p, _o, i, _r in _rows(cfg)) == list(range(3050))


@pytest.mark.bigquery
def test_on_bigquery_a_changed_sql_restarts_the_query_in_the_running_driver_and_a_bad_one_is_refused(
        cluster: Cluster, kafka, bigquery, tmp_path: Path) -> None:
    """The same in-place path into a BigQuery table (Storage Write API commits, the ledger in the table): a new SQL
    is run by the same driver process, a bad one refused while the stream goes on, a dedupe on a derived key and
    then on that key as another type each rebuild the window in place, every record once."""
    topic = f"bqtransform-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    kafka.create_topic(f"{topic}-dlq", partitions=1)
    produce(kafka.bootstrap, topic, range(0, 600))
    ns = cluster.new_namespace("bqtransform-e2e")
    spec = bigquery_spec(kafka.bootstrap, topic, tmp_path, bigquery, transform={"sql": SQL_V1},
                         dedupe={"keys": ["id"], "within": "1h"}, deadLetter={"topic": f"{topic}-dlq"})
    with local_handoff(cluster, ns, spec, tmp_path, kafka.bootstrap, topic) as (kubelet, cfg):
        assert cfg.sink.kind == "bigquery"
        seen = [_wanted_hash(cluster, ns)]
        _new_sql_then_a_bad_one(cluster, ns, kafka, cfg, topic, seen, range(600, 1200), range(1200, 1500))
        assert kubelet.starts == 1 and len(set(kubelet.templates)) == 1, kubelet.crashes()
        assert kubelet.logs().count("restarted with the operator's query config") == 1, kubelet.logs()[-3000:]

        # A derived dedupe key, then the same key as another type: Spark keys the dedupe's state by the keys' names
        # and types, so each change discards the checkpoint in the running driver and rebuilds the window from the
        # ledger (driver.resume), where keeping it would fail the query on Spark's old state.
        okey = f"SELECT id, ts, upper(region) AS region, CAST(id AS {{}}) AS okey, {KAFKA_COLUMNS} FROM source"
        v3 = _changed(cluster, ns, {"transform": {"sql": okey.format("INT")}, "dedupe": {"keys": ["okey"]}}, seen,
                      "a derived key")
        _running(cluster, ns, CONFIG_HASH_KEY, v3, "the driver deduping on the derived key")
        _committed(kafka, cfg, topic, range(1500, 1600), "the records after the derived key committed")
        v4 = _changed(cluster, ns, {"transform": {"sql": okey.format("BIGINT")}}, seen, "the key as a bigint")
        _running(cluster, ns, CONFIG_HASH_KEY, v4, "the driver deduping on the key as a bigint")
        _committed(kafka, cfg, topic, range(1600, 1700), "the records after the key's new type committed")
        assert kubelet.starts == 1 and len(set(kubelet.templates)) == 1, kubelet.crashes()
        logs = kubelet.logs()
        assert "dedupe key types changed: okey from int to bigint" in logs, logs[-3000:]
        assert logs.count("holds Spark's dedupe state for other keys and is discarded") == 2, logs[-6000:]

        # A declared column added and read by the SQL: the same driver adds it to the BigQuery table (a NULLABLE
        # column) at the batch boundary and writes it (orders 1700..1799 carry a note).
        _a_noted_column(cluster, ns, kafka, cfg, topic, spec, seen,
                        f"SELECT id, ts, upper(region) AS region, CAST(id AS BIGINT) AS okey, note, {KAFKA_COLUMNS} "
                        f"FROM source", range(1700, 1800))
        assert kubelet.starts == 1 and len(set(kubelet.templates)) == 1, kubelet.crashes()
        assert kubelet.logs().count("restarted with the operator's query config") == 4, kubelet.logs()[-3000:]

    _each_order_once_as_derived(bigquery_rows(cfg), 1800, [(range(600), str, "before: the first SQL"),
                                                            (range(600, 1800), str.upper, "after: the second")])
    from handoff_spark.bigquery import client as bigquery_client

    client = bigquery_client.rest_client(cfg.sink)  # type: ignore[arg-type]
    notes = {int(r["id"]): r["note"] for r in client.query(
        f"SELECT id, note FROM `{bigquery_client.table_ref(cfg.sink)}`", retry=None).result()}  # type: ignore[arg-type]
    assert {i: n for i, n in notes.items() if n is not None} == {i: f"n{i}" for i in range(1700, 1800)}, notes


def test_a_transform_and_a_dedupe_added_to_a_handoff_on_the_fused_path_and_removed_again_run_in_the_same_driver(
        cluster: Cluster, kafka, tmp_path: Path) -> None:
    """A handoff without a transform runs the fused path. Its pace changes in the running driver; a transform and a
    dedupe added later switch the running driver's query to the DataFrame path, and removing them switches it back,
    each at a batch boundary in the same process: the checkpoint the other path's query wrote is discarded and the
    query starts from the table's ledger (with the dedupe's window rebuilt from it). Orders re-sent while the dedupe
    runs are dropped; every order is in the table once, with the SQL's derivation only while the SQL ran."""
    topic = f"switch-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    kafka.create_topic(f"{topic}-dlq", partitions=1)
    produce(kafka.bootstrap, topic, range(0, 500))
    ns = cluster.new_namespace("switch-e2e")
    spec = iceberg_spec(kafka.bootstrap, topic, tmp_path, "shop.switched", deadLetter={"topic": f"{topic}-dlq"})
    with local_handoff(cluster, ns, spec, tmp_path, kafka.bootstrap, topic) as (kubelet, cfg):
        assert not cfg.frame_path
        seen = [_wanted_hash(cluster, ns)]
        eventually(lambda: _record(cluster, ns).get(CONFIG_HASH_KEY) == seen[0], "the driver reporting its config")

        # The fused path's pace: the next 300 records come in batches of at most 50.
        pace = _changed(cluster, ns, {"source": {"maxRecordsPerBatch": 50}}, seen, "the fused path's pace")
        _running(cluster, ns, CONFIG_HASH_KEY, pace, "the driver running the new pace")
        before = end_offsets(kafka.bootstrap, topic)
        _committed(kafka, cfg, topic, range(500, 800), "the records at the new pace committed")
        sizes = _batch_sizes_from(cfg, topic, before)
        assert sum(sizes) == 300 and max(sizes) <= 50 and len(sizes) >= 6, sizes

        # A transform and a dedupe: the same driver's query now carries the records as Spark rows. Orders 900..999
        # are sent twice, and orders 700..799 (written by the fused path's query) once more: the dedupe's window,
        # rebuilt from the ledger, drops them all.
        rows = _changed(cluster, ns, {"transform": {"sql": SQL_V2}, "dedupe": {"keys": ["id"], "within": "1h"}},
                        seen, "a transform and a dedupe")
        _running(cluster, ns, CONFIG_HASH_KEY, rows, "the driver running the transform and the dedupe")
        _committed(kafka, cfg, topic, range(800, 1000), "the records through the SQL committed")
        _committed(kafka, cfg, topic, range(900, 1000), "the re-sent orders read")
        _committed(kafka, cfg, topic, range(700, 800), "the fused path's orders re-sent and read")

        # Back to the fused path, in the same driver again (with another batch size: the config is then none of the
        # fused path's above).
        back = _changed(cluster, ns, {"transform": None, "dedupe": None, "source": {"maxRecordsPerBatch": 300}}, seen,
                        "no transform and no dedupe")
        _running(cluster, ns, CONFIG_HASH_KEY, back, "the driver back on the fused path")
        _committed(kafka, cfg, topic, range(1000, 1200), "the records after the switch back committed")

        logs = _one_driver(kubelet, 3, "the three changes")
        assert logs.count("was written by the other path's query and is discarded") == 2, logs[-6000:]
        assert "the query moved from the fused path to the DataFrame path" in logs, logs[-6000:]
        assert "the query moved from the DataFrame path (a transform, dedupe or event time) to the fused path" \
            in logs, logs[-6000:]

        table = _rows(cfg)
        assert len(table) == 1200, (len(table), "200 re-sent orders dropped by the dedupe")
        _each_order_once_as_derived(table, 1200, [(range(800), str, "the fused path"),
                                                  (range(800, 1000), str.upper, "the SQL"),
                                                  (range(1000, 1200), str, "the fused path again")])


def _ids_by_topic(cfg: AppConfig) -> dict[str, list[int]]:
    """Each topic's order ids in the table, sorted (duplicates kept, so a duplicate shows)."""
    sink = cfg.sink
    table = ledger.load_table(sink.catalog_name, dict(sink.catalog_properties), sink.table)  # type: ignore[union-attr]
    data = table.scan(selected_fields=("_kafka_topic", "id")).to_arrow()
    out: dict[str, list[int]] = {}
    for topic, order in zip(data["_kafka_topic"].to_pylist(), data["id"].to_pylist()):
        out.setdefault(topic, []).append(order)
    return {t: sorted(ids) for t, ids in out.items()}


def test_topics_added_removed_and_added_back_run_in_the_same_driver_and_a_missing_one_is_refused(
        cluster: Cluster, kafka, tmp_path: Path) -> None:
    """spec.source.topics and spec.source.startingOffsets change in the running driver (fused path): a topic added with
    startingOffsets latest starts at its end, though the query keeps its checkpoint (before, such a topic was read from
    its beginning whatever startingOffsets said, and from startingOffsets only once the checkpoint was lost); a topic
    Kafka lacks is refused in one line (SourceInvalid) and rolled back while the stream goes on; a removed topic is not
    read, and added back (with another address of the broker, a new consumer group and minPartitions, the source's
    other query settings) it resumes where the table's ledger left it, and the commits go to the new group. Every
    order once, one driver process."""
    first, second = (f"topics-{uuid.uuid4().hex[:6]}-{n}" for n in ("a", "b"))
    kafka.create_topic(first, partitions=2)
    kafka.create_topic(second, partitions=2)
    kafka.create_topic(f"{first}-dlq", partitions=1)
    produce(kafka.bootstrap, first, range(0, 300))
    produce(kafka.bootstrap, second, range(10_000, 10_200))  # before the topic is added: not read (latest)
    history = end_offsets(kafka.bootstrap, second)
    ns = cluster.new_namespace("topics-e2e")
    spec = iceberg_spec(kafka.bootstrap, first, tmp_path, "shop.topics", deadLetter={"topic": f"{first}-dlq"})
    with local_handoff(cluster, ns, spec, tmp_path, kafka.bootstrap, first, pod_name=True) as (kubelet, cfg):
        assert not cfg.frame_path
        seen = [_wanted_hash(cluster, ns)]
        eventually(lambda: _record(cluster, ns).get(CONFIG_HASH_KEY) == seen[0], "the driver reporting its config")

        source = {**spec["source"], "topics": [first, second], "startingOffsets": "latest"}
        added = _changed(cluster, ns, {"source": source}, seen, "a second topic")
        _running(cluster, ns, CONFIG_HASH_KEY, added, "the driver reading the second topic")
        # `latest` is the topic's end when the query first plans it: a batch has run with it before new orders go in
        # (orders produced between the query's restart and that batch are, rightly, not read).
        eventually(lambda: second in ((r := _record(cluster, ns)).get(CONFIG_HASH_KEY) == added and r.get("offsets")
                                      or {}), "the second topic entered at its end")
        # The table's ledger (the truth, not the checkpoint) names where it entered before any of its records: a driver
        # that lost its checkpoint now resumes it there, not at a later end.
        def table() -> Any:
            return ledger.load_table(cfg.sink.catalog_name, dict(cfg.sink.catalog_properties),  # type: ignore[union-attr]
                                     cfg.sink.table)  # type: ignore[union-attr]

        eventually(lambda: ledger.resume_offsets(table()).get(second) == history,
                   "the ledger naming where the second topic entered", timeout=60)
        _committed(kafka, cfg, second, range(10_200, 10_300), "the second topic's new orders committed")
        # The ledger holds the second topic from where it entered on: its history (the offsets below its entry) is not
        # claimed by the batch it entered in, which read none of it, so a Backfill may still bring it in.
        held = [(p, se) for c in ledger.list_commits(table(), include_markers=False)
                for p, se in c.offsets.get(second, {}).items() if se[1] > se[0]]
        assert held and all(se[0] >= history[p] for p, se in held), (held, history)
        _committed(kafka, cfg, first, range(300, 400), "the first topic's orders committed alongside")
        _marked_good(cluster, ns, added, "the second topic")

        missing = f"{first}-nope"
        refused = _changed(cluster, ns, {"source": {**source, "topics": [first, second, missing]}}, seen,
                           "a topic Kafka lacks")
        record = _running(cluster, ns, CONFIG_REFUSED_HASH_KEY, refused, "the driver refusing the missing topic")
        assert record[CONFIG_REFUSED_KEY].startswith("SourceInvalid: spec.source.topics: Kafka has no topic "
                                                     f"'{missing}'"), record
        assert record[CONFIG_HASH_KEY] == added, record
        upgrade = eventually(lambda: ((cluster.get(ns, "orders").get("status") or {}).get("upgrade") or {})
                             .get("rolledBackConfigHash") == refused and cluster.get(ns, "orders")["status"]["upgrade"],
                             "the missing topic rolled back", timeout=120)
        assert upgrade["rolledBackReason"] == "SourceInvalid", upgrade
        _committed(kafka, cfg, first, range(400, 500), "the stream going on with the topics before")

        # The first topic removed: its next orders wait in Kafka. Added back, it resumes where the ledger left it.
        only_second = _changed(cluster, ns, {"source": {**source, "topics": [second]}}, seen, "the first topic removed")
        _running(cluster, ns, CONFIG_HASH_KEY, only_second, "the driver reading the second topic only")
        produce(kafka.bootstrap, first, range(500, 600))
        _committed(kafka, cfg, second, range(10_300, 10_400), "the second topic's orders committed alone")
        assert _ids_by_topic(cfg)[first] == list(range(500)), "a removed topic is not read"
        # The driver's record of the batch that read them (published apart from the commit, so waited for):
        ends = {str(p): e for p, e in end_offsets(kafka.bootstrap, second).items()}
        record = eventually(lambda: (r := _record(cluster, ns)).get(CONFIG_HASH_KEY) == only_second
                            and (r.get("offsets") or {}).get(second) == ends and r, "the record of a batch after it")
        assert first not in record["lag"] and second in record["lag"], record  # not read: no lag for it (nor a 0)
        # Added back with the source's other query settings changed too: another address of the same broker, a new
        # consumer group and task count.
        group = f"lag-tools-{uuid.uuid4().hex[:6]}"
        servers = kafka.bootstrap.replace("127.0.0.1", "localhost")
        assert servers != kafka.bootstrap
        both = _changed(cluster, ns, {"source": {**source, "topics": [second, first], "consumerGroup": group,
                                                 "minPartitions": 5, "bootstrapServers": servers}}, seen,
                        "the first topic back")
        _running(cluster, ns, CONFIG_HASH_KEY, both, "the driver reading the first topic again")
        _committed(kafka, cfg, first, range(600, 700), "the first topic's waiting and new orders committed")
        # The sink mirrors its commits to the new group (after the table commit: waited for).
        ends = end_offsets(kafka.bootstrap, first)
        eventually(lambda: committed_group_offsets(kafka.bootstrap, group, [(first, p) for p in ends]).get(first)
                   == ends, "the new consumer group at the first topic's end")

        logs = _one_driver(kubelet, 3, "the topic changes")
        assert f"the operator's query config {refused} is refused; the query runs on with config {added}" \
            in logs, logs[-3000:]
        assert _ids_by_topic(cfg) == {first: list(range(700)), second: list(range(10_200, 10_400))}
