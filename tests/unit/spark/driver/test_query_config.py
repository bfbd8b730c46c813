"""driver.query_config: which of the operator's query configs (transform, dedupe, event time, schema, dead-letter
topic, upkeep, source topics, pace) a running driver takes (pure), and what it publishes about the config it runs or refused. The
change end to end: a local driver and the operator, tests/e2e/test_operator_transform_change.py; a real node,
tests/e2e/test_in_cluster_pod_options.py."""
from __future__ import annotations

import json

import pytest

from handoff_spark.config import AppConfig, Transform
from handoff_spark.contract import (CONFIG_COMMITTED_KEY, CONFIG_HASH_KEY, CONFIG_REFUSED_HASH_KEY, CONFIG_REFUSED_KEY,
                                    CONFIG_SINCE_KEY, QUERY_CONFIG_PARTS, QUERY_HELD_KEY)
from handoff_spark.driver import query_config
from handoff_spark.driver.publisher import state_key

SQL = "SELECT * FROM source WHERE amount > 0"


def _cfg(tmp_path, **extra) -> AppConfig:
    return AppConfig.model_validate({
        "handoffId": "ns/x", "source": {"bootstrapServers": "b:9092", "topics": ["t"]},
        "sink": {"kind": "iceberg", "table": "db.t"},
        "schema": {"onIncompatible": "halt", "columns": [{"name": "id", "type": "long"},
                                                          {"name": "amount", "type": "double"}]},
        "deadLetterTopic": "t-dlq", "transform": {"sql": SQL},
        "checkpointLocation": f"file://{tmp_path}/ck", **extra})


def _annotation(sql: str = "SELECT id, amount, _kafka_topic FROM source", pod: str = "p1", config: str = "h2") -> str:
    return json.dumps({"configHash": config, "podConfigHash": pod, "transform": {"sql": sql, "lookups": []}})


def test_the_driver_takes_only_a_config_made_for_its_own_pod_template():
    wanted = query_config.parse(_annotation(), "p1")
    assert wanted == query_config.Wanted("h2", Transform(sql="SELECT id, amount, _kafka_topic FROM source"))
    assert query_config.parse(_annotation(pod="p2"), "p1") is None  # the next pod's (the Deployment rolls out)
    assert query_config.parse(_annotation(), None) is None          # not in a pod the operator renders
    assert query_config.parse(None, "p1") is None
    for broken in ("{", "[]", json.dumps({"podConfigHash": "p1", "transform": {"sql": SQL}}),
                   json.dumps({"configHash": "h2", "podConfigHash": "p1", "transform": {"sql": ""}})):
        assert query_config.parse(broken, "p1") is None, broken


def test_a_changed_dedupe_or_event_time_is_a_query_config_too(tmp_path):
    doc = {"configHash": "h4", "podConfigHash": "p1", "transform": {"sql": SQL},
           "dedupe": {"keys": ["id", "amount"], "withinSeconds": 600},
           "eventTime": {"column": "ts", "watermarkSeconds": 30}}
    wanted = query_config.parse(json.dumps(doc), "p1")
    assert wanted is not None and wanted.dedupe is not None and wanted.dedupe.keys == ["id", "amount"]
    assert wanted.event_time is not None and wanted.event_time.late_records == "deadLetter"
    cfg = _cfg(tmp_path)
    assert not wanted.runs_in(cfg)
    new = query_config.applied(cfg, wanted)
    assert wanted.runs_in(new) and new.transform == cfg.transform
    assert (new.dedupe.within_seconds, new.event_time.watermark_seconds) == (600, 30)
    # Back to none of them but the transform: what cfg runs.
    assert query_config.parse(_annotation(sql=SQL), "p1").runs_in(cfg)
    assert query_config.parse(json.dumps({**doc, "dedupe": {"keys": []}}), "p1") is None  # unreadable: logged


def test_adding_or_removing_the_transform_is_a_query_config_too(tmp_path):
    """A handoff on the fused path gets a transform, and loses it again, in its running driver: the query config
    with none of them is the fused path's, and the app config's rules hold for each (a dedupe needs a dead-letter
    topic whatever the path)."""
    fused = _cfg(tmp_path, transform=None)
    assert not fused.frame_path
    added = query_config.parse(_annotation(sql=SQL), "p1")
    assert added is not None and not added.runs_in(fused)
    rows = query_config.applied(fused, added)
    assert rows.frame_path and rows.transform == Transform(sql=SQL)
    none = query_config.parse(json.dumps({"configHash": "h3", "podConfigHash": "p1", "transform": None}), "p1")
    assert none is not None and none.runs_in(fused) and not none.runs_in(rows)
    assert query_config.applied(rows, none) == fused
    dedupe = json.dumps({"configHash": "h5", "podConfigHash": "p1", "dedupe": {"keys": ["id"], "withinSeconds": 60}})
    with pytest.raises(ValueError, match="deadLetterTopic"):
        query_config.applied(fused.model_copy(update={"dead_letter_topic": None}), query_config.parse(dedupe, "p1"))


def test_the_wanted_transform_replaces_only_the_transform_and_the_app_configs_rules_still_hold(tmp_path):
    cfg = _cfg(tmp_path)
    new = query_config.applied(cfg, query_config.Wanted("h2", Transform(sql="SELECT * FROM source")))
    assert new.transform is not None and new.transform.sql == "SELECT * FROM source"
    assert new.model_dump(exclude={"transform"}) == cfg.model_dump(exclude={"transform"})
    no_dlq = cfg.model_copy(update={"dead_letter_topic": None})
    with pytest.raises(ValueError, match="deadLetterTopic"):
        query_config.applied(no_dlq, query_config.Wanted("h2", Transform(sql=SQL)))


def test_the_querys_pace_is_a_query_config_too_and_kept_when_the_annotation_carries_none(tmp_path):
    """spec.commitInterval, spec.source.maxRecordsPerBatch and the event-time column: the trigger, the source's batch
    size and the freshness column of the next query. An annotation without them (an operator that wrote none) leaves
    the driver's own; a bad value is unreadable (logged)."""
    cfg = _cfg(tmp_path)
    doc = {**json.loads(_annotation(sql=SQL)), "triggerIntervalSeconds": 30, "maxRecordsPerBatch": 50,
           "eventTimeColumn": "amount"}
    wanted = query_config.parse(json.dumps(doc), "p1")
    assert wanted is not None and wanted.pace == query_config.Pace(30.0, 50, "amount")
    assert not wanted.runs_in(cfg)
    new = query_config.applied(cfg, wanted)
    assert (new.trigger_interval_seconds, new.source.max_records_per_batch) == (30.0, 50) and wanted.runs_in(new)
    assert new.schema_.event_time_column == "amount" and cfg.schema_.event_time_column is None
    assert new.model_dump(exclude={"trigger_interval_seconds", "source", "schema_"}) == cfg.model_dump(
        exclude={"trigger_interval_seconds", "source", "schema_"})
    assert new.schema_.model_dump(exclude={"event_time_column"}) == cfg.schema_.model_dump(
        exclude={"event_time_column"})
    assert query_config.parse(json.dumps({k: v for k, v in doc.items() if k != "eventTimeColumn"}), "p1").pace is None
    unlimited = query_config.parse(json.dumps({**doc, "maxRecordsPerBatch": None}), "p1")
    assert unlimited is not None and query_config.applied(new, unlimited).source.max_records_per_batch is None
    none_given = query_config.parse(_annotation(sql=SQL), "p1")
    assert none_given is not None and none_given.pace is None and none_given.runs_in(new)
    assert query_config.applied(new, none_given) == new
    assert query_config.parse(json.dumps({**doc, "triggerIntervalSeconds": "soon"}), "p1") is None
    with pytest.raises(ValueError, match="maxRecordsPerBatch"):
        query_config.applied(cfg, query_config.parse(json.dumps({**doc, "maxRecordsPerBatch": 0}), "p1"))


def test_the_dead_letter_topic_and_the_tables_upkeep_are_query_configs_too_and_kept_when_not_carried(tmp_path):
    """spec.deadLetter.topic (the next query's writers produce to it) and the upkeep of spec.replay.window (the
    snapshot expiry the query's commits run). An annotation without them (an operator that wrote none) leaves the
    driver's own; a null topic is "none", and the app config's rules still hold for it."""
    assert set(query_config.MODELS) | {query_config.DEAD_LETTER_KEY} == set(QUERY_CONFIG_PARTS)
    assert set(query_config.Wanted("h", None).model_parts()) == set(query_config.MODELS)
    cfg = _cfg(tmp_path)
    doc = {**json.loads(_annotation(sql=SQL)), "deadLetterTopic": "t-dlq-2",
           "maintenance": {"expireOlderThanSeconds": 1209600}}
    wanted = query_config.parse(json.dumps(doc), "p1")
    assert wanted is not None and wanted.dead_letter == query_config.DeadLetter("t-dlq-2")
    assert wanted.maintenance is not None and wanted.maintenance.expire_older_than_seconds == 1209600
    assert not wanted.runs_in(cfg)
    new = query_config.applied(cfg, wanted)
    assert (new.dead_letter_topic, new.maintenance.expire_older_than_seconds) == ("t-dlq-2", 1209600)
    assert wanted.runs_in(new)
    assert new.model_dump(exclude={"dead_letter_topic", "maintenance"}) == cfg.model_dump(
        exclude={"dead_letter_topic", "maintenance"})
    none_given = query_config.parse(_annotation(sql=SQL), "p1")
    assert none_given is not None and (none_given.dead_letter, none_given.maintenance) == (None, None)
    assert none_given.runs_in(new) and query_config.applied(new, none_given) == new
    # A null topic: none. The transform needs one, so the config is refused as the app config refuses it.
    with pytest.raises(ValueError, match="deadLetterTopic"):
        query_config.applied(cfg, query_config.parse(json.dumps({**doc, "deadLetterTopic": None}), "p1"))
    assert query_config.parse(json.dumps({**doc, "deadLetterTopic": 7}), "p1") is None  # unreadable: logged
    assert query_config.parse(json.dumps({**doc, "maintenance": {"everyBatches": 0}}), "p1") is None


def test_the_sources_query_settings_are_a_query_config_too_and_kept_when_not_carried(tmp_path):
    """spec.source.bootstrapServers, topics, startingOffsets, minPartitions and consumerGroup: the driver's next query
    reads the new topics from the new servers, splits its batches so and mirrors its commits to the new group. An annotation without them (an operator
    that wrote none) leaves the driver's own; a malformed one is unreadable (logged)."""
    from handoff_spark.contract import QUERY_CONFIG_SOURCE
    from handoff_spark.kafka.source import source_options

    assert set(query_config.SOURCE_KEYS) == set(QUERY_CONFIG_SOURCE) == {
        "bootstrapServers", "topics", "startingOffsets", "minPartitions", "consumerGroup"}
    cfg = _cfg(tmp_path)
    doc = {**json.loads(_annotation(sql=SQL)), "bootstrapServers": "kafka-2:9092", "topics": ["t", "u"],
           "startingOffsets": "latest",
           "minPartitions": 12, "consumerGroup": "lag-tools"}
    wanted = query_config.parse(json.dumps(doc), "p1")
    assert wanted is not None and wanted.source == query_config.SourceQuery("kafka-2:9092", ("t", "u"), "latest", 12,
                                                                           "lag-tools")
    assert not wanted.runs_in(cfg)
    new = query_config.applied(cfg, wanted)
    assert (new.source.bootstrap_servers, new.source.topics, new.source.starting_offsets, new.source.min_partitions,
            new.consumer_group) == ("kafka-2:9092", ["t", "u"], "latest", 12, "lag-tools")
    # What the next query's source and commits take from it.
    options = source_options(new, None)
    assert (options["kafka.bootstrap.servers"], options["subscribe"], options["startingOffsets"],
            options["minPartitions"]) == ("kafka-2:9092", "t,u", "latest", "12")
    assert wanted.runs_in(new) and query_config.SourceQuery.of(new) == wanted.source
    assert new.model_dump(exclude={"source"}) == cfg.model_dump(exclude={"source"})
    kept = {"bootstrap_servers", "topics", "starting_offsets", "min_partitions", "consumer_group"}
    assert new.source.model_dump(exclude=kept) == cfg.source.model_dump(exclude=kept)
    # Back to the defaults: null is "the default" for the last two, not "not carried".
    defaults = query_config.parse(json.dumps({**doc, "minPartitions": None, "consumerGroup": None}), "p1")
    back = query_config.applied(new, defaults)
    assert (back.source.min_partitions, back.consumer_group) == (None, f"handoff-{cfg.handoff_id.replace('/', '.')}")
    assert not defaults.runs_in(new) and defaults.runs_in(back)
    none_given = query_config.parse(_annotation(sql=SQL), "p1")
    assert none_given is not None and none_given.source is None
    assert none_given.runs_in(new) and query_config.applied(new, none_given) == new
    for bad in ({"topics": []}, {"topics": "t"}, {"topics": ["t", ""]}, {"startingOffsets": "middle"},
                {"bootstrapServers": ""}, {"bootstrapServers": None}, {"minPartitions": 0}, {"minPartitions": "4"}, {"minPartitions": True}, {"consumerGroup": ""},
                {"consumerGroup": 3}):
        assert query_config.parse(json.dumps({**doc, **bad}), "p1") is None, bad
    partial = dict(doc)
    del partial["consumerGroup"]
    assert query_config.parse(json.dumps(partial), "p1").source is None  # not all carried: none taken


class _Publisher:
    def __init__(self) -> None:
        self.offered: list[dict] = []

    def offer(self, record: dict) -> None:
        self.offered.append(dict(record))


def test_the_record_says_which_config_runs_drops_the_old_snapshot_and_says_a_refusal_until_cleared(tmp_path):
    from handoff_spark.driver.app import ProgressReporter

    publisher = _Publisher()
    reporter = ProgressReporter(_cfg(tmp_path), None, lambda _line: None, publisher)
    reporter.config("h1", 1_000, changed=False)  # at start, before any batch
    assert publisher.offered[-1] == {"handoffId": "ns/x", "totals": reporter.totals.record(),
                                     CONFIG_HASH_KEY: "h1", CONFIG_SINCE_KEY: 1_000}
    reporter._offer({**reporter._base(), "batchId": 7, "committedSnapshot": 42})
    line = "TransformInvalid: spec.transform.sql: nope"
    reporter.refused("h3", line)
    assert publisher.offered[-1][CONFIG_REFUSED_HASH_KEY] == "h3" and publisher.offered[-1][CONFIG_REFUSED_KEY] == line
    assert publisher.offered[-1][CONFIG_HASH_KEY] == "h1" and publisher.offered[-1]["committedSnapshot"] == 42
    # A hold's acknowledgement keeps them (the operator reads both at once).
    reporter.held("rewind")
    assert publisher.offered[-1][QUERY_HELD_KEY] == "rewind" and publisher.offered[-1][CONFIG_REFUSED_HASH_KEY] == "h3"
    # The query restarted with h2: a snapshot of h1's batch is no evidence for h2; the refusal is gone.
    reporter.config("h2", 2_000, changed=True)
    last = publisher.offered[-1]
    assert (last[CONFIG_HASH_KEY], last[CONFIG_SINCE_KEY], last["batchId"]) == ("h2", 2_000, 7)
    assert "committedSnapshot" not in last and CONFIG_REFUSED_KEY not in last and QUERY_HELD_KEY not in last


def test_the_configs_newest_commit_stays_through_empty_batches_and_goes_when_the_query_restarts(tmp_path):
    """`configCommittedSnapshot`: the operator's evidence that the config it tries committed, which an idle stream's
    empty batch (no snapshot) must not take away, and a batch of the config before must not give."""
    from handoff_spark.driver.app import ProgressReporter
    from handoff_spark.driver.progress import report_from_progress

    def batch(batch_id: int, snapshot: int | None) -> None:
        progress = {"batchId": batch_id, "numInputRows": 1 if snapshot else 0, "durationMs": {"triggerExecution": 5},
                    "sources": [{"startOffset": json.dumps({"t": {"0": batch_id}}),
                                 "endOffset": json.dumps({"t": {"0": batch_id + 1}}),
                                 "latestOffset": json.dumps({"t": {"0": batch_id + 1}})}]}
        commit = {"batch_id": batch_id, "snapshot_id": snapshot, "dlq_rows": 0, "skipped": False}
        reporter._emit(report_from_progress(progress, commit, None), {})

    publisher = _Publisher()
    reporter = ProgressReporter(_cfg(tmp_path), None, lambda _line: None, publisher)
    batch(0, 40)  # not in a pod the operator renders (no config yet): no such key
    assert CONFIG_COMMITTED_KEY not in publisher.offered[-1]
    reporter.config("h1", 1_000, changed=False)
    batch(1, 41)
    assert publisher.offered[-1][CONFIG_COMMITTED_KEY] == 41
    batch(2, None)  # nothing committed
    assert publisher.offered[-1]["committedSnapshot"] is None and publisher.offered[-1][CONFIG_COMMITTED_KEY] == 41
    reporter.refused("h3", "TransformInvalid: spec.transform.sql: nope")
    assert publisher.offered[-1][CONFIG_COMMITTED_KEY] == 41
    reporter.config("h1", 1_000, changed=False)  # the refusal cleared: the same query runs on
    assert publisher.offered[-1][CONFIG_COMMITTED_KEY] == 41
    reporter.config("h2", 2_000, changed=True)
    assert CONFIG_COMMITTED_KEY not in publisher.offered[-1]
    batch(3, None)
    assert CONFIG_COMMITTED_KEY not in publisher.offered[-1]
    batch(4, 44)
    assert publisher.offered[-1][CONFIG_COMMITTED_KEY] == 44 and publisher.offered[-1][CONFIG_HASH_KEY] == "h2"


def test_a_new_config_or_refusal_is_published_at_once():
    base = {"handoffId": "ns/x", CONFIG_HASH_KEY: "h1"}
    assert state_key(base) != state_key({**base, CONFIG_HASH_KEY: "h2"})
    assert state_key(base) != state_key({**base, CONFIG_REFUSED_HASH_KEY: "h3"})
    assert state_key(base) == state_key({**base, "batchId": 8})


def test_the_declared_schema_is_a_query_config_too_and_kept_when_the_annotation_carries_none(tmp_path):
    """spec.schema (its columns, evolution, policy, limits) changes in the running driver: the annotation's replaces
    the app config's; one without a schema (an operator that wrote none) leaves the driver's own."""
    cfg = _cfg(tmp_path)
    schema = json.loads(cfg.to_json())["schema"]
    wider = {**schema, "columns": schema["columns"] + [{"name": "note", "type": "string", "required": False}]}
    wanted = query_config.parse(json.dumps({**json.loads(_annotation(sql=SQL)), "schema": wider}), "p1")
    assert wanted is not None and wanted.schema is not None and not wanted.runs_in(cfg)
    new = query_config.applied(cfg, wanted)
    assert [c.name for c in new.schema_.columns] == ["id", "amount", "note"] and wanted.runs_in(new)
    assert new.model_dump(exclude={"schema_"}) == cfg.model_dump(exclude={"schema_"})
    same = query_config.parse(json.dumps({**json.loads(_annotation(sql=SQL)), "schema": schema}), "p1")
    assert same is not None and same.runs_in(cfg) and not same.runs_in(new)
    none_given = query_config.parse(_annotation(sql=SQL), "p1")
    assert none_given is not None and none_given.schema is None and none_given.runs_in(new)
    assert query_config.applied(new, none_given) == new
    # The app config's rules hold for it: deadLetter for incompatible records needs the dead-letter topic.
    dead_letter = query_config.parse(json.dumps({**json.loads(_annotation(sql=SQL)),
                                                 "schema": {**schema, "onIncompatible": "deadLetter"}}), "p1")
    with pytest.raises(ValueError, match="deadLetterTopic"):
        query_config.applied(cfg.model_copy(update={"dead_letter_topic": None, "transform": None}), dead_letter)


def test_a_new_schema_reconciles_the_table_at_the_boundary_or_is_refused_in_one_line(tmp_path):
    """driver.app.reconcile_schema against a real Iceberg table (a SQLite catalog): a column added is added to the
    table as a start adds it; a type the table's column cannot become is refused with `SchemaIncompatible:
    spec.schema: …` and the table is left as it was; the same schema touches nothing; a catalog that fails is not the
    spec's fault: tried again later, not refused."""
    from handoff_spark.driver.app import reconcile_schema
    from handoff_spark.iceberg import ledger
    from handoff_spark.sink import registry as sinks

    cfg = _cfg(tmp_path, sink={"kind": "iceberg", "table": "db.t", "catalogProperties": {
        "type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/wh"}})
    backend = sinks.get("iceberg")
    backend.prepare(cfg)

    def columns() -> dict[str, str]:
        table = ledger.load_table(cfg.sink.catalog_name, dict(cfg.sink.catalog_properties), "db.t")
        return {f.name: str(f.field_type) for f in table.schema().fields}

    before = columns()
    assert reconcile_schema(backend, cfg, cfg).taken and columns() == before
    schema = json.loads(cfg.to_json())["schema"]
    wider = query_config.applied(cfg, query_config.Wanted("h2", cfg.transform, schema=type(cfg.schema_)
                                                           .model_validate({**schema, "columns": schema["columns"] + [
                                                               {"name": "note", "type": "string"}]})))
    assert reconcile_schema(backend, cfg, wider).taken
    assert columns() == {**before, "note": "string"}
    retyped = query_config.applied(wider, query_config.Wanted("h3", cfg.transform, schema=type(cfg.schema_)
                                                               .model_validate({**schema, "columns": [
                                                                   {"name": "id", "type": "long"},
                                                                   {"name": "amount", "type": "string"}]})))
    outcome = reconcile_schema(backend, wider, retyped)
    line = outcome.refused
    assert line is not None and line.startswith("SchemaIncompatible: spec.schema: ") and "amount" in line, line
    assert "\n" not in line and outcome.retry is None and columns() == {**before, "note": "string"}
    unreachable = wider.model_copy(update={"sink": wider.sink.model_copy(update={"catalog_properties": {
        **wider.sink.catalog_properties, "uri": f"sqlite:///{tmp_path}/no-such-dir/c.db"}})})
    outcome = reconcile_schema(backend, cfg, unreachable)
    assert outcome.refused is None and outcome.retry is not None and "\n" not in outcome.retry, outcome
