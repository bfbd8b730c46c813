"""Which sinks read their Kafka ranges in the write task (the fused path), and what a task hands its sink."""
from __future__ import annotations

import pyarrow as pa
import pytest

from handoff_spark.driver.app import uses_fused_read
from handoff_spark.config import AppConfig
from handoff_spark.kafka.source import ARROW_SCHEMA
from handoff_spark.sink.common import task_records

ICEBERG = {"kind": "iceberg", "table": "db.t"}
BIGQUERY = {"kind": "bigquery", "project": "p", "dataset": "d", "table": "t"}


def _cfg(sink: dict) -> AppConfig:
    return AppConfig.model_validate({"handoffId": "ns/x", "source": {"bootstrapServers": "b:9092", "topics": ["t"]},
                                     "sink": sink, "schema": {"onIncompatible": "halt"},
                                     "checkpointLocation": "/tmp/ck"})


@pytest.mark.parametrize("sink", [ICEBERG, BIGQUERY], ids=["iceberg", "bigquery"])
def test_both_table_sinks_read_their_ranges_themselves(sink: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HANDOFF_FUSED_READ", raising=False)
    cfg = _cfg(sink)
    assert uses_fused_read(cfg)
    assert not uses_fused_read(cfg, sink_format="noop")  # test/bench sinks get the record source
    monkeypatch.setenv("HANDOFF_FUSED_READ", "0")
    assert not uses_fused_read(cfg)


def test_record_batches_pass_through_untouched() -> None:
    batch = pa.RecordBatch.from_pylist([{"topic": "t", "partition": 0, "offset": 7, "timestamp": None, "key": None,
                                         "value": b"{}", "headers": None}], schema=ARROW_SCHEMA)
    out = list(task_records(_cfg(ICEBERG), iter([batch, batch])))
    assert out == [batch, batch]
    assert list(task_records(_cfg(ICEBERG), iter([]))) == []
