"""With HANDOFF_PARALLEL_START=1 the driver prepares the table beside the Spark session's start (`app.Prepare`):
a table problem found there still ends the driver with that problem — its own error, not an interrupted
session start."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_table_problem_found_beside_the_session_start_fails_the_driver_with_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    cfg = {"handoffId": "t/start", "source": {"bootstrapServers": "127.0.0.1:9", "topics": ["t"]},
           "sink": {"kind": "iceberg", "catalogName": "start", "table": "ns.t",
                    "catalogProperties": {"type": "sql", "uri": f"sqlite:///{missing}/catalog.db",
                                          "warehouse": f"file://{missing}/wh"}},
           "schema": {"onIncompatible": "halt"},
           "checkpointLocation": str(tmp_path / "ck"), "sparkConf": {"spark.master": "local[1]"}}
    (tmp_path / "app.json").write_text(json.dumps(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "spark_app"), "PYSPARK_PYTHON": sys.executable,
           "HANDOFF_PARALLEL_START": "1"}
    proc = subprocess.run([sys.executable, "-m", "handoff_spark", "run", "--config", str(tmp_path / "app.json")],
                          capture_output=True, text=True, env=env, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "unable to open database file" in out  # SQLite's own error for the catalog's missing directory
    assert "KeyboardInterrupt" not in out and "spark session started" not in out
