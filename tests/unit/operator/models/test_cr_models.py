"""The CR models: examples round-trip, defaults, helpers, and the validation rules (the same rules the
CRD's CEL enforces at the API server; tests/integration/operator/crd/test_crds_apiserver.py checks that side)."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from handoff_operator.models import (Condition, ReplayRequest, StreamTableHandoff, StreamTableHandoffSpec,
                                     StreamTableHandoffStatus, format_duration, parse_duration,
                                     quantity_to_bytes, spark_memory)
from handoff_operator.models.replay_request import ReplayRequestSpec

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"
MINIMAL = {"source": {"bootstrapServers": "k:9092", "topics": ["orders"]},
           "sink": {"iceberg": {"table": "shop.orders"}}}


def _load(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / name).read_text())


@pytest.mark.parametrize("name,model", [("orders-to-iceberg.yaml", StreamTableHandoff),
                                        ("clicks-to-bigquery.yaml", StreamTableHandoff),
                                        ("orders-transform-to-iceberg.yaml", StreamTableHandoff),
                                        ("replay-rollback.yaml", ReplayRequest)])
def test_example_round_trip(name: str, model: type) -> None:
    manifest = _load(name)
    obj = model.model_validate(manifest)
    dumped = obj.to_dict()
    # Everything the user wrote comes back unchanged (defaults may be added, nothing lost or renamed).
    def contains(full: object, part: object, where: str = "") -> None:
        if isinstance(part, dict):
            assert isinstance(full, dict), where
            for k, v in part.items():
                assert k in full, f"{where}.{k} lost"
                contains(full[k], v, f"{where}.{k}")
        elif isinstance(part, list):
            assert isinstance(full, list) and len(full) == len(part), where
            for i, (a, b) in enumerate(zip(full, part)):
                contains(a, b, f"{where}[{i}]")
        elif model is ReplayRequest and where.endswith(".timestamp"):
            assert str(full).replace("+00:00", "Z") == str(part), where
        else:
            assert full == part, f"{where}: {full!r} != {part!r}"
    contains(dumped, manifest)
    assert model.model_validate(dumped) == obj


def test_defaults_and_helpers() -> None:
    spec = StreamTableHandoffSpec.model_validate(MINIMAL)
    assert spec.commit_interval_seconds == 10
    assert spec.replay_window_seconds == 7 * 86400
    assert spec.replay_max_outage_seconds == 86400
    assert spec.freshness_target_seconds == 300
    assert (spec.scaling.min_executors, spec.scaling.max_executors) == (1, 4)
    assert spec.spark.executor.memory == "2Gi" and spec.spark.driver.memory == "1Gi"
    assert spec.schema_.on_incompatible == "halt"
    assert spec.sink.kind == "iceberg"
    orders = StreamTableHandoff.model_validate(_load("orders-to-iceberg.yaml")).spec
    assert orders.commit_interval_seconds == 30 and orders.target_catch_up_seconds == 600
    assert orders.scaling_cooldown_seconds == 180


@pytest.mark.parametrize("text,seconds", [("250ms", 0.25), ("10s", 10), ("5m", 300), ("1h30m", 5400),
                                          ("7d", 604800), ("2w", 1209600), ("1.5h", 5400)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["10", "", "5 m", "m", "-5s", "1y"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 42, 60, 192, 3600, 7500, 86400, 90000)] == \
        ["0s", "42s", "1m", "3m12s", "1h", "2h5m", "1d", "1d1h"]


def test_quantities() -> None:
    assert quantity_to_bytes("512Mi") == 512 << 20
    assert quantity_to_bytes("1G") == 10**9
    assert quantity_to_bytes("1e9") == 10**9
    assert spark_memory("2Gi") == "2048m"
    assert spark_memory("1G") == "954m"
    with pytest.raises(ValueError):
        quantity_to_bytes("2GB")


def _invalid(mutate) -> str:
    spec = copy.deepcopy(MINIMAL)
    mutate(spec)
    with pytest.raises(ValidationError) as err:
        StreamTableHandoffSpec.model_validate(spec)
    return str(err.value)


def test_spec_rules() -> None:
    assert "exactly one of sink.iceberg or sink.bigquery" in _invalid(
        lambda s: s["sink"].update(bigquery={"project": "p1", "dataset": "d", "table": "t"}))
    assert "exactly one of sink.iceberg or sink.bigquery" in _invalid(lambda s: s.update(sink={}))
    assert "minExecutors must be <= scaling.maxExecutors" in _invalid(
        lambda s: s.update(scaling={"minExecutors": 5, "maxExecutors": 2}))
    assert "at least 1 item" in _invalid(lambda s: s["source"].update(topics=[]))
    assert "earliest" in _invalid(lambda s: s["source"].update(startingOffsets="middle"))
    assert "pattern" in _invalid(lambda s: s.update(commitInterval="10"))
    assert "pattern" in _invalid(lambda s: s["sink"]["iceberg"].update(table="orders"))
    bad_type = _invalid(lambda s: s.update(schema={"columns": [{"name": "a", "type": "varchar"}]}))
    assert "schema.columns.0.type" in bad_type and "unknown type 'varchar'" in bad_type
    assert "duplicate column names: a" in _invalid(lambda s: s.update(
        schema={"columns": [{"name": "a", "type": "string"}, {"name": "a", "type": "long"}]}))
    assert "eventTimeColumn" in _invalid(lambda s: s.update(
        schema={"columns": [{"name": "a", "type": "string"}], "eventTimeColumn": "a"}))
    assert "needs deadLetter.topic" in _invalid(lambda s: s.update(schema={"onIncompatible": "deadLetter"}))
    assert "must not be one of source.topics" in _invalid(lambda s: s.update(deadLetter={"topic": "orders"}))
    assert "propertiesFrom" in _invalid(lambda s: s["source"].update(properties={"sasl.password": "x"}))
    assert "group.id" in _invalid(lambda s: s["source"].update(properties={"group.id": "x"}))
    assert "spark.executor.instances" in _invalid(
        lambda s: s.update(spark={"sparkConf": {"spark.executor.instances": "3"}}))
    assert "below 32Mi" in _invalid(lambda s: s.update(spark={"driver": {"memory": "1Mi"}}))
    assert "maxOutage must not exceed replay.window" in _invalid(
        lambda s: s.update(replay={"window": "1h", "maxOutage": "1d"}))
    assert "at least commitInterval" in _invalid(
        lambda s: s.update(commitInterval="5m", freshness={"target": "1m"}))
    assert "exactly one of secretRef or secretKeyRef" in _invalid(lambda s: s["source"].update(
        propertiesFrom=[{"property": "sasl.password", "secretRef": {"name": "a"},
                         "secretKeyRef": {"name": "a", "key": "b"}}]))
    assert "Extra inputs are not permitted" in _invalid(lambda s: s.update(maxExecutor=3))


def test_column_types_match_the_spark_app() -> None:
    for t in ("string", "int", "long", "float", "double", "boolean", "timestamp", "date", "binary",
              "decimal(10,2)", "decimal(38, 0)"):
        spec = copy.deepcopy(MINIMAL)
        spec["schema"] = {"columns": [{"name": "c", "type": t}]}
        StreamTableHandoffSpec.model_validate(spec)


def _replay(**spec) -> dict:
    return {"handoffRef": {"name": "orders"}, **spec}


def test_replay_rules() -> None:
    ok = ReplayRequestSpec.model_validate(_replay(mode="Backfill", **{"from": {"t": {"0": 5}}},
                                                  to={"t": {"0": 9}}))
    assert ok.from_ == {"t": {"0": 5}} and ok.to_dict()["from"] == {"t": {"0": 5}}
    snap = ReplayRequestSpec.model_validate(_replay(mode="Rollback", target={"snapshotId": "8123456789012345678"}))
    assert snap.target.snapshot_id == 8123456789012345678
    cases = [
        (_replay(mode="Backfill", **{"from": {"t": {"0": 5}}}), "requires from and to"),
        (_replay(mode="Rollback"), "requires target"),
        (_replay(mode="RollbackAndReplay", target={}), "exactly one of snapshotId, timestamp or tag"),
        (_replay(mode="Rollback", target={"tag": "a", "snapshotId": 1}), "exactly one of"),
        (_replay(mode="Backfill", **{"from": {"t": {"0": 9}}}, to={"t": {"0": 5}}), "is before from"),
        (_replay(mode="Backfill", **{"from": {"t": {"0": 1}}}, to={"u": {"0": 5}}), "same topics"),
        (_replay(mode="Rollback", target={"tag": "a"}, to={"t": {"0": 5}}), "only apply to mode Backfill"),
        (_replay(mode="Restore", target={"tag": "a"}), "RollbackAndReplay"),
    ]
    for spec, message in cases:
        with pytest.raises(ValidationError, match=message):
            ReplayRequestSpec.model_validate(spec)


def test_status_round_trip_keeps_snapshot_ids_exact() -> None:
    status = StreamTableHandoffStatus.model_validate({
        "observedGeneration": 3, "phase": "Running", "lag": 12, "freshness": "42s",
        "conditions": [{"type": "Ready", "status": "True", "reason": "Committing",
                        "lastTransitionTime": "2026-11-22T03:00:00Z", "observedGeneration": 3}],
        "committed": {"snapshot": 8123456789012345678, "batch": 7, "offsets": {"orders": {"0": 100}},
                      "at": "2026-11-22T03:00:05Z"},
        "executors": {"current": 2, "desired": 3},
        "somethingNewer": {"x": 1},  # written by a newer operator: ignored, not an error
    })
    wire = status.to_dict()
    assert wire["committed"]["snapshot"] == "8123456789012345678"  # string: jq/JS safe
    assert wire["conditions"][0]["lastTransitionTime"] == "2026-11-22T03:00:00Z"
    assert StreamTableHandoffStatus.model_validate(wire) == status
    assert Condition(type="Ready", status="False", reason="SinkUnavailable").to_dict()["lastTransitionTime"].endswith("Z")


def test_resource_name_rule_matches_the_renderer() -> None:
    from handoff_operator.spec import render
    from handoff_operator.models import stream_table_handoff as sth

    assert sth.MAX_NAME_LENGTH == render.MAX_NAME_LENGTH
    manifest = _load("orders-to-iceberg.yaml")
    manifest["metadata"]["name"] = "x" * (sth.MAX_NAME_LENGTH + 1)
    with pytest.raises(ValidationError, match="metadata.name must be at most"):
        StreamTableHandoff.model_validate(manifest)
    manifest["metadata"]["name"] = "Orders"
    with pytest.raises(ValidationError, match="metadata.name must be at most"):
        StreamTableHandoff.model_validate(manifest)


# ---- transform, dedupe, eventTime (issue 31)

FRAMES = {**MINIMAL, "deadLetter": {"topic": "orders-dlq"},
          "transform": {"sql": "SELECT * FROM source WHERE amount > 0",
                        "lookups": [{"name": "customers", "table": "crm.customers"}]},
          "dedupe": {"keys": ["order_id"], "within": "1h"},
          "eventTime": {"column": "created_at", "watermark": "30s", "lateRecords": "deadLetter"}}


def test_transform_dedupe_and_event_time_round_trip_under_their_camel_case_names() -> None:
    spec = StreamTableHandoffSpec.model_validate(FRAMES)
    dumped = spec.model_dump(by_alias=True, exclude_none=True)
    for key in ("transform", "dedupe", "eventTime"):
        assert dumped[key] == FRAMES[key], key
    assert StreamTableHandoffSpec.model_validate(dumped) == spec


def test_the_three_fields_are_absent_by_default_and_event_time_has_its_defaults() -> None:
    plain = StreamTableHandoffSpec.model_validate(MINIMAL)
    assert plain.transform is None and plain.dedupe is None and plain.event_time is None
    spec = StreamTableHandoffSpec.model_validate({**MINIMAL, "deadLetter": {"topic": "orders-dlq"},
                                                  "eventTime": {"column": "ts"},
                                                  "transform": {"sql": "SELECT * FROM source"}})
    assert spec.event_time is not None
    assert (spec.event_time.watermark, spec.event_time.late_records) == ("0s", "deadLetter")
    assert spec.transform is not None and spec.transform.lookups == []


@pytest.mark.parametrize("change, where", [
    ({"dedupe": {"keys": ["order_id"], "within": "1 hour"}}, "dedupe.within"),
    ({"dedupe": {"keys": ["order_id"], "within": "60"}}, "dedupe.within"),
    ({"eventTime": {"column": "created_at", "watermark": "soon"}}, "eventTime.watermark"),
    ({"eventTime": {"column": "created_at", "lateRecords": "drop"}}, "eventTime.lateRecords"),
    ({"eventTime": {"column": "created-at"}}, "eventTime.column"),
    ({"dedupe": {"keys": [], "within": "1h"}}, "dedupe.keys"),
    ({"transform": {"sql": ""}}, "transform.sql"),
    ({"transform": {"sql": "SELECT * FROM source", "lookups": [{"name": "c", "table": "customers"}]}},
     "transform.lookups.0.table"),
    ({"transform": {"sql": "SELECT * FROM source", "lookups": [{"name": "my customers", "table": "crm.c"}]}},
     "transform.lookups.0.name"),
    ({"dedupe": {"keys": ["order_id"], "within": "1h", "window": "2h"}}, "dedupe.window"),
])
def test_bad_values_are_refused_naming_the_field(change: dict, where: str) -> None:
    with pytest.raises(ValidationError) as err:
        StreamTableHandoffSpec.model_validate({**FRAMES, **change})
    locs = [".".join(str(p) for p in e["loc"]) for e in err.value.errors()]
    assert where in locs, locs


def test_event_time_may_repeat_schema_event_time_column_but_not_contradict_it() -> None:
    columns = [{"name": "created_at", "type": "timestamp"}, {"name": "sent_at", "type": "timestamp"}]
    same = {**FRAMES, "schema": {"columns": columns, "eventTimeColumn": "created_at"}}
    assert StreamTableHandoffSpec.model_validate(same).event_time is not None
    with pytest.raises(ValidationError, match="schema.eventTimeColumn differs from eventTime.column"):
        StreamTableHandoffSpec.model_validate({**same, "schema": {"columns": columns, "eventTimeColumn": "sent_at"}})
