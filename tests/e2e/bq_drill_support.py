"""Shared machinery of the BigQuery exactly-once drills: the app config for the emulator, the app run as a
subprocess (reusing the Iceberg drills' runner, which takes a commit counter), and the invariants every drill
ends with — checked from BigQuery alone."""
from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from handoff_spark.bigquery import client as bigquery_client, ledger as bigquery_ledger
from handoff_spark.config import AppConfig
from handoff_testbed.process_tree import kill_tree

from bq_common import table_counts
from iceberg_drill_support import PY, REPO, Run, end_offsets

COLUMNS = [{"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamp"},
           {"name": "region", "type": "string"}]


def bq_drill_config(tmp_path: Path, emulator: Any, bootstrap: str, topic: str, *, max_records: int = 400,
                    schema: dict[str, Any] | None = None, sink: dict[str, Any] | None = None,
                    **overrides: Any) -> AppConfig:
    doc: dict[str, Any] = {
        "handoffId": "drills/" + topic,
        "source": {"bootstrapServers": bootstrap, "topics": [topic], "maxRecordsPerBatch": max_records},
        "sink": {"kind": "bigquery", "project": emulator.project, "dataset": f"drill_{uuid.uuid4().hex[:8]}",
                 "table": "t_" + topic.replace("-", "_"), "restEndpoint": emulator.rest_endpoint,
                 "grpcEndpoint": emulator.grpc_endpoint, "partitionBy": "ts", **(sink or {})},
        "schema": schema or {"columns": COLUMNS, "onIncompatible": "halt"},
        "checkpointLocation": str(tmp_path / "checkpoint"),
        "progressFile": str(tmp_path / "progress.json"),
    }
    doc.update(overrides)
    cfg = AppConfig.model_validate(doc)
    (tmp_path / "app.json").write_text(cfg.to_json())
    return cfg


def bq_commits(cfg: AppConfig) -> int:
    """Batches committed so far, from the data table (the truth, not the best-effort ledger)."""
    try:
        client = bigquery_client.rest_client(cfg.sink)
        ref = bigquery_client.table_ref(cfg.sink)
        rows = list(client.query(f"SELECT COUNT(DISTINCT _handoff_batch_id) AS n FROM `{ref}`", retry=None).result())
        return int(rows[0]["n"])
    except Exception:  # noqa: BLE001 — table not there yet, emulator restarting
        return 0


def assert_exactly_once(cfg: AppConfig, bootstrap: str, produced: int, topic: str, dead_letters: int = 0,
                        index_complete: bool = True) -> None:
    """rows == produced (minus dead letters), distinct (topic, partition, offset) == rows, and what BigQuery
    says the table holds ends at the topic's end offsets. `index_complete`: also every offset is covered by a
    ledger-index row (not so when a crash between the data commit and its index row was never replayed, e.g.
    because the checkpoint was lost: the index is best effort, the data table is the truth)."""
    rows, distinct = table_counts(cfg)
    assert rows == produced - dead_letters, (rows, produced, dead_letters)
    assert distinct == rows
    ends = end_offsets(bootstrap, topic)
    assert bigquery_ledger.resume_offsets(cfg.sink)[topic] == ends
    last = bigquery_ledger.latest_commit(cfg.sink, cfg.handoff_id)
    assert last is not None
    if not index_complete:
        return
    # the ledger is an index written after each commit; every offset of the topic is covered by some commit
    covered = {p: 0 for p in ends}
    for c in reversed(bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)):  # oldest first
        for p, (start, end) in c.offsets.get(topic, {}).items():
            assert start == covered[p], f"ledger gap or overlap at partition {p}: {start} != {covered[p]}"
            covered[p] = end
    assert covered == ends


def run_bq_app(tmp_path: Path, cfg: AppConfig, env: dict[str, str] | None = None, timeout: float = 300,
               on_commits: tuple[int, Callable[[], None]] | None = None, kill_after_commits: int | None = None) -> Run:
    """One run of the real driver entry point (`python -m handoff_spark run --available-now`) in its own
    session, so a fault hook's kill -9 takes driver, JVM and Python workers. `on_commits=(n, fn)`: call fn once
    while the app runs, when n batches are in the table (emulator restart). `kill_after_commits`: kill -9 the
    app's process group once that many batches are in the table (at whatever point the app is then in)."""
    n = len(list(tmp_path.glob("app-*.log")))
    log = tmp_path / f"app-{n}.log"
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "spark_app"), str(REPO / "hack")]),
                "PYSPARK_PYTHON": PY, "PYSPARK_DRIVER_PYTHON": PY, **(env or {})}
    with log.open("w") as fh:
        proc = subprocess.Popen([PY, "-m", "handoff_spark", "run", "--config", str(tmp_path / "app.json"),
                                 "--available-now"], stdout=fh, stderr=subprocess.STDOUT, env=full_env,
                                start_new_session=True, cwd=tmp_path)
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"app did not finish in {timeout}s; see {log}")
                if on_commits is not None and bq_commits(cfg) >= on_commits[0]:
                    on_commits[1]()
                    on_commits = None
                if kill_after_commits is not None and bq_commits(cfg) >= kill_after_commits:
                    kill_tree(proc.pid)  # every process, as a pod dies
                    proc.wait()
                    break
                time.sleep(0.3)
        finally:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.wait()
    return Run(proc.returncode, log)


def run_bq_to_completion(tmp_path: Path, cfg: AppConfig, max_runs: int = 4, **kw: Any) -> list[Run]:
    """Run the app again until it exits 0; only the first run gets the fault/env/hook."""
    runs = []
    for _ in range(max_runs):
        r = run_bq_app(tmp_path, cfg, **kw)
        runs.append(r)
        if r.returncode == 0:
            return runs
        kw.pop("env", None)
        kw.pop("on_commits", None)
        kw.pop("kill_after_commits", None)
    raise AssertionError(f"app never finished cleanly: {[(r.returncode, str(r.log)) for r in runs]}\n"
                         + runs[-1].log.read_text()[-4000:])
