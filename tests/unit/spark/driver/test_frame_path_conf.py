"""The DataFrame path's session settings (`app.frame_path_conf`, pure): a dedupe keeps its state in RocksDB, off the
executors' heap, without RocksDB's row count and with its changelog checkpointing; the shuffle is 8 partitions; a user's own setting wins; the fused path
gets none of them."""
from __future__ import annotations

from typing import Any

from handoff_spark.config import AppConfig
from handoff_spark.driver.app import (FRAME_SHUFFLE_PARTITIONS, ROCKSDB_CHANGELOG_KEY, ROCKSDB_STATE_STORE,
                                      ROCKSDB_TRACK_ROWS_KEY, STATE_STORE_KEY, frame_path_conf)


def cfg(**fields: Any) -> AppConfig:
    return AppConfig.model_validate({
        "handoffId": "ns/h", "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
        "sink": {"kind": "iceberg", "table": "db.t"}, "checkpointLocation": "/tmp/ck", "deadLetterTopic": "dlq",
        "schema": {"columns": [{"name": "id", "type": "long"}, {"name": "ts", "type": "timestamp"}]}, **fields})


def test_a_dedupe_keeps_its_state_in_rocksdb_with_the_paths_shuffle():
    conf = frame_path_conf({"spark.master": "local[2]"}, cfg(dedupe={"keys": ["id"], "withinSeconds": 60}))
    assert conf == {"spark.master": "local[2]", STATE_STORE_KEY: ROCKSDB_STATE_STORE, ROCKSDB_TRACK_ROWS_KEY: "false",
                    ROCKSDB_CHANGELOG_KEY: "true", "spark.sql.shuffle.partitions": str(FRAME_SHUFFLE_PARTITIONS)}


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
