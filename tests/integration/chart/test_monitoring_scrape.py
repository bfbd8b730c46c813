"""Every metric the chart's Grafana dashboard and alert rules read is one the code exports: scrape a running
operator (`handoff operator` against the test bed's API server) and a running driver (`python -m handoff_spark
run`, which serves its metrics before it starts Spark), and compare the names the rendered chart's PromQL
selects with what the two endpoints expose. A selector marked handoff!="" must be the driver's, handoff="" the
operator's."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from monitoring_support import MONITORING_ON, chart_metrics, exposed_names, render
from operator_support import REPO, eventually

pytestmark = pytest.mark.apiserver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()
    except OSError:
        return None


@contextmanager
def _process(args: list[str], log: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                start_new_session=True, cwd=log.parent)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver may have started its JVM meanwhile
        proc.wait(30)


def test_dashboard_and_rules_read_only_metrics_a_running_driver_and_operator_export(apiserver, tmp_path):
    wanted = chart_metrics(render(MONITORING_ON))
    operator_port = _free_port()
    driver_dir = tmp_path / "driver"
    driver_dir.mkdir()
    (driver_dir / "app.json").write_text(json.dumps({
        "handoffId": "shop/orders", "source": {"bootstrapServers": "127.0.0.1:9", "topics": ["orders"]},
        "sink": {"kind": "iceberg", "table": "shop.orders", "catalogProperties": {
            "type": "sql", "uri": f"sqlite:///{driver_dir}/c.db", "warehouse": f"file://{driver_dir}/w"}},
        "schema": {"onIncompatible": "halt"}, "checkpointLocation": str(driver_dir / "ck"), "metricsPort": 0}))
    with _process([sys.executable, "-m", "handoff_operator", "operator"], tmp_path / "operator.log",
                  {"KUBECONFIG": str(apiserver.kubeconfig), "HANDOFF_METRICS_PORT": str(operator_port)}) as op, \
            _process([sys.executable, "-m", "handoff_spark", "run", "--config", "app.json", "--sink", "noop"],
                     driver_dir / "driver.log", {"PYTHONUNBUFFERED": "1",
                                                 "PYTHONPATH": str(REPO / "spark_app")}) as driver:
        def driver_port() -> int | None:
            assert driver.poll() is None, (driver_dir / "driver.log").read_text()[-3000:]
            return next((int(line.split(":")[1].split("/")[0])
                         for line in (driver_dir / "driver.log").read_text().splitlines()
                         if line.startswith("metrics on :")), None)

        port = eventually(driver_port, "the driver's metrics port", 120)
        driver_names = exposed_names(eventually(lambda: _scrape(port), "a scrape of the driver", 60))

        def operator_text() -> str | None:
            assert op.poll() is None, (tmp_path / "operator.log").read_text()[-3000:]
            return _scrape(operator_port)

        operator_names = exposed_names(eventually(operator_text, "a scrape of the operator", 120))
    assert "handoff_rows_total" in driver_names and "handoff_reconciles_total" in operator_names
    exported = {"driver": driver_names, "operator": operator_names, "any": driver_names | operator_names}
    missing = sorted(f"{name} ({whose})" for name, whose in wanted if name not in exported[whose])
    assert missing == [], f"the chart reads metrics nobody exports: {missing}"
