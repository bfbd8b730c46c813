"""What a person must fix gets one line naming the fix, exit code 2, and no traceback (the driver entry point
as the operator runs it; nothing here needs a running service)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]


def _run(tmp_path: Path, doc: dict, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "app.json").write_text(json.dumps(doc))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOGLE_")}
    env.update({"NO_GCE_CHECK": "true", "HOME": str(tmp_path),  # no GCE metadata probe, no gcloud config
                "PYTHONPATH": str(REPO / "spark_app")})
    return subprocess.run([sys.executable, "-m", "handoff_spark", *args, "--config", str(tmp_path / "app.json")],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)


def _doc(tmp_path: Path, sink: dict, **extra) -> dict:
    return {"handoffId": "ns/h", "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]}, "sink": sink,
            "schema": {"onIncompatible": "halt"}, "checkpointLocation": str(tmp_path / "ck"), **extra}


def test_bigquery_without_credentials_names_the_fields(tmp_path):
    run = _run(tmp_path, _doc(tmp_path, {"kind": "bigquery", "project": "p", "dataset": "d", "table": "t"}), "run")
    assert run.returncode == 2, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]  # (google-auth logs a warning line of its own before it)
    assert "Traceback" not in run.stderr
    assert last.startswith("handoff: BigQuery sink p.d.t: no credentials") and "credentialsFrom" in last


def test_busy_metrics_port_is_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = _run(tmp_path, _doc(tmp_path, {"kind": "iceberg", "catalogProperties": {
            "type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/w"},
            "table": "ns.t"}, metricsPort=port), "run", "--sink", "noop")
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert f"metrics port {port} cannot be used" in run.stderr and "--metrics-port 0" in run.stderr


def test_backfill_arguments_are_checked_before_anything_runs(tmp_path):
    doc = _doc(tmp_path, {"kind": "iceberg", "catalogProperties": {"type": "sql", "uri": "sqlite:///x.db",
                                                                    "warehouse": "file:///tmp/w"}, "table": "ns.t"})
    run = _run(tmp_path, doc, "backfill", "--query", "bf", "--from", '{"other": {"0": 1}}', "--to",
               '{"other": {"0": 5}}')
    assert run.returncode == 2 and "topic 'other' is not one of the handoff's topics" in run.stderr
    run = _run(tmp_path, doc, "backfill", "--query", "handoff", "--from", '{"t": {"0": 1}}', "--to", '{"t": {"0": 5}}')
    assert run.returncode == 2 and "--query must differ" in run.stderr


def test_invalid_app_config_is_one_line(tmp_path):
    run = _run(tmp_path, {"handoffId": "ns/h", "sink": {"kind": "iceberg", "table": "ns.t"}}, "run")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.count("\n") == 1 and "source: Field required" in run.stderr, run.stderr
