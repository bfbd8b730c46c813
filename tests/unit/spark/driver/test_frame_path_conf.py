"""The DataFrame path's session settings (`app.frame_path_conf`, pure): a dedupe keeps its state in RocksDB, off the
executors' heap, without RocksDB's row count and with its changelog checkpointing; the shuffle has the operator's
partitions on a cluster (8 when it named none) and a local master's cores; a user's own setting wins; the fused path
gets none of them. And the no-data batches a query starts with (`app.no_data_batches`, on a real streaming plan)."""
from __future__ import annotations

import os
from typing import Any

import pytest

from handoff_spark.config import AppConfig
from handoff_spark.contract import SHUFFLE_PARTITIONS_CONF
from handoff_spark.driver.app import (FRAME_SHUFFLE_PARTITIONS, ROCKSDB_CHANGELOG_KEY, ROCKSDB_STATE_STORE,
                                      ROCKSDB_TRACK_ROWS_KEY, STATE_STORE_KEY, frame_path_conf, local_cores,
                                      no_data_batches)


def cfg(**fields: Any) -> AppConfig:
    return AppConfig.model_validate({
        "handoffId": "ns/h", "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
        "sink": {"kind": "iceberg", "table": "db.t"}, "checkpointLocation": "/tmp/ck", "deadLetterTopic": "dlq",
        "schema": {"columns": [{"name": "id", "type": "long"}, {"name": "ts", "type": "timestamp"}]}, **fields})


def test_a_dedupe_keeps_its_state_in_rocksdb_with_the_paths_shuffle():
    cluster = "k8s://https://10.0.0.1:443"
    conf = frame_path_conf({"spark.master": cluster}, cfg(dedupe={"keys": ["id"], "withinSeconds": 60}))
    assert conf == {"spark.master": cluster, STATE_STORE_KEY: ROCKSDB_STATE_STORE,
                    ROCKSDB_TRACK_ROWS_KEY: "false", ROCKSDB_CHANGELOG_KEY: "true",
                    "spark.sql.shuffle.partitions": str(FRAME_SHUFFLE_PARTITIONS)}


def test_a_clusters_shuffle_has_the_operators_partitions():
    """The operator names one partition per executor core the handoff may scale to (contract.SHUFFLE_PARTITIONS_CONF);
    a driver without it (an older operator's config, `handoff run` on a cluster) keeps 8."""
    dedupe = cfg(dedupe={"keys": ["id"], "withinSeconds": 60})
    named = {"spark.master": "k8s://https://10.0.0.1:443", SHUFFLE_PARTITIONS_CONF: "12"}
    assert frame_path_conf(dict(named), dedupe)["spark.sql.shuffle.partitions"] == "12"
    for junk in ("0", "-3", "lots", ""):
        conf = frame_path_conf({SHUFFLE_PARTITIONS_CONF: junk}, dedupe)
        assert conf["spark.sql.shuffle.partitions"] == str(FRAME_SHUFFLE_PARTITIONS), junk
    mine = frame_path_conf({**named, "spark.sql.shuffle.partitions": "5"}, dedupe)
    assert mine["spark.sql.shuffle.partitions"] == "5"


def test_a_local_masters_shuffle_has_one_partition_per_core():
    dedupe = cfg(dedupe={"keys": ["id"], "withinSeconds": 60})
    assert frame_path_conf({}, dedupe, local_cores("local[2]"))["spark.sql.shuffle.partitions"] == "2"
    assert frame_path_conf({}, dedupe, local_cores("local"))["spark.sql.shuffle.partitions"] == "1"
    assert frame_path_conf({"spark.sql.shuffle.partitions": "5"}, dedupe, 2)["spark.sql.shuffle.partitions"] == "5"


@pytest.mark.parametrize(("master", "cores"), [
    ("local", 1), ("local[3]", 3), ("local[4,2]", 4), ("local[*]", len(os.sched_getaffinity(0))),
    ("local[*, 3]", len(os.sched_getaffinity(0))), (" local[2] ", 2),
    ("k8s://https://10.0.0.1:443", None), ("spark://h:7077", None), ("local-cluster[2,1,1024]", None), (None, None),
    ("", None)])
def test_local_cores_reads_spark_master_urls(master, cores):
    assert local_cores(master) == cores


def test_the_users_own_state_store_and_shuffle_win():
    mine = {STATE_STORE_KEY: "org.example.MyStore", "spark.sql.shuffle.partitions": "3", ROCKSDB_TRACK_ROWS_KEY: "true",
            ROCKSDB_CHANGELOG_KEY: "false"}
    assert frame_path_conf(dict(mine), cfg(dedupe={"keys": ["id"], "withinSeconds": 60})) == mine


def test_no_dedupe_no_state_store_and_the_fused_path_is_untouched():
    transform_only = frame_path_conf({}, cfg(transform={"sql": "SELECT * FROM source"}))
    assert transform_only == {"spark.sql.shuffle.partitions": str(FRAME_SHUFFLE_PARTITIONS)}
    event_time_only = frame_path_conf({}, cfg(eventTime={"column": "ts", "watermarkSeconds": 30}))
    assert not {STATE_STORE_KEY, ROCKSDB_TRACK_ROWS_KEY, ROCKSDB_CHANGELOG_KEY} & set(event_time_only)
    assert frame_path_conf({"a": "b"}, cfg()) == {"a": "b"}


def test_no_data_batches_are_off_only_when_the_dedupe_is_the_only_state():
    """A dedupe whose transform has nothing waiting on the watermark gets no no-data batch (it would only evict
    keys); an aggregating or self-joining transform keeps them; without a dedupe Spark's default stands."""
    dedupe = cfg(dedupe={"keys": ["id"], "withinSeconds": 60}, transform={"sql": "SELECT * FROM source"})
    assert no_data_batches(dedupe, []) is False
    assert no_data_batches(dedupe, ["Aggregate"]) is True
    assert no_data_batches(cfg(dedupe={"keys": ["id"], "withinSeconds": 60}), []) is False
    assert no_data_batches(cfg(transform={"sql": "SELECT * FROM source"}), []) is True
    assert no_data_batches(cfg(eventTime={"column": "ts", "watermarkSeconds": 30}), []) is True


def test_a_query_start_sets_no_data_batches_from_its_plan_and_a_users_setting_wins(spark):
    """`app.set_no_data_batches`, as `start_query` calls it on the streaming plan: off for a dedupe whose transform
    only filters, on for one that aggregates; a key in `spec.spark.sparkConf` (in the session since its build) is
    left as the user set it."""
    from handoff_spark.driver.app import NO_DATA_BATCHES_KEY, set_no_data_batches

    def rate_cfg(sql: str, **conf: str) -> AppConfig:
        columns = [{"name": "value", "type": "long"}, {"name": "timestamp", "type": "timestamp"}]
        return cfg(schema={"columns": columns}, transform={"sql": sql}, dedupe={"keys": ["value"], "withinSeconds": 60},
                   sparkConf=conf)

    spark.readStream.format("rate").load().createOrReplaceTempView("src")
    filtered = spark.sql("SELECT * FROM src WHERE value > 3")
    set_no_data_batches(spark, rate_cfg("SELECT * FROM source WHERE value > 3"), filtered)
    assert spark.conf.get(NO_DATA_BATCHES_KEY) == "false"
    aggregated_sql = "SELECT value, count(*) AS n FROM source GROUP BY value"
    counted = spark.sql(aggregated_sql.replace("source", "src"))
    set_no_data_batches(spark, rate_cfg(aggregated_sql), counted)
    assert spark.conf.get(NO_DATA_BATCHES_KEY) == "true"
    spark.conf.set(NO_DATA_BATCHES_KEY, "false")  # as the user's sparkConf set it at the session's build
    set_no_data_batches(spark, rate_cfg(aggregated_sql, **{NO_DATA_BATCHES_KEY: "false"}), counted)
    assert spark.conf.get(NO_DATA_BATCHES_KEY) == "false"
