"""The session warm-up (handoff_spark.startup.session_warmup) runs one task, whatever the cores: one task per core took
every core of a local master just as the stream's first batch needed them, and Spark's FIFO order ran its job ahead
of the stream's second wave."""
from __future__ import annotations

import json
import urllib.request
from typing import Any

from handoff_spark.config import AppConfig
from handoff_spark.startup import session_warmup


def test_the_warm_up_query_runs_one_task_on_two_cores_and_finishes(tmp_path: Any) -> None:
    from handoff_spark.driver.app import build_session

    cfg = AppConfig.model_validate({
        "handoffId": "test/warmup", "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
        "sink": {"kind": "iceberg", "table": "shop.orders", "catalogProperties": {
            "type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}},
        "schema": {"onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path / "ck"),
        # the UI's REST API lists the jobs and their tasks; port 0: any free one
        "sparkConf": {"spark.master": "local[2]", "spark.ui.enabled": "true", "spark.ui.port": "0"}})
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    catalog = load_catalog("handoff", **cfg.sink.catalog_properties)  # the warm-up's commit opens the table
    catalog.create_namespace("shop")
    catalog.create_table("shop.orders", Schema(NestedField(1, "id", LongType(), required=False)))
    spark = build_session(cfg)
    try:
        assert spark.sparkContext.defaultParallelism == 2
        outcome = session_warmup.run(spark, cfg, lambda: None)
        assert outcome.startswith("session warm-up done in"), outcome
        url = spark.sparkContext.uiWebUrl
        assert url is not None and url.startswith("http://127.0.0.1:"), url
        with urllib.request.urlopen(f"{url}/api/v1/applications/{spark.sparkContext.applicationId}/jobs",
                                    timeout=30) as resp:
            jobs = json.load(resp)
    finally:
        spark.stop()
    warmup = [j for j in jobs if (j.get("description") or "").startswith(session_warmup.QUERY_NAME)]
    assert warmup, [j.get("description") for j in jobs]
    assert [(j["numTasks"], j["status"]) for j in warmup] == [(1, "SUCCEEDED")] * len(warmup)
