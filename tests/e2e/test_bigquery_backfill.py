"""A Backfill into a BigQuery table, through what a user types: `handoff run`, `handoff replay -f -r` (the
operator's plan) and the backfill command it prints (`python -m handoff_spark backfill`, what the operator's Job
runs), against the test bed's Kafka and BigQuery emulator.

The handoff starts at `startingOffsets: latest`, so the table lacks the topic's history; a Backfill of that range
writes it once, under its own ledger query, and the stream's position and consumer group do not move. Overlaps are
refused before anything is written: by the plan (the ledger index) and by the driver (the data table itself).
Ends with rows == distinct (partition, offset) == produced.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer

from handoff_spark.bigquery import ledger as bigquery_ledger
from handoff_spark.config import AppConfig
from handoff_spark.kafka.offsets import committed_group_offsets

from bq_common import table_counts
from iceberg_drill_support import REPO, end_offsets

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.bigquery]

COLUMNS = [{"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamp"}]


def _produce(bootstrap: str, topic: str, ids: range) -> int:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in ids:
        ts = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=7 * i)
        p.produce(topic, key=str(i).encode(), value=json.dumps({"id": i, "ts": ts.isoformat()}).encode())
    assert p.flush(30) == 0
    return len(ids)


class Handoff:
    """A StreamTableHandoff manifest on the emulator and the commands a person runs on it."""

    def __init__(self, tmp_path: Path, bigquery: Any, bootstrap: str, topic: str) -> None:
        self.tmp_path, self.topic = tmp_path, topic
        self.checkpoint = str(tmp_path / "checkpoint")
        self.manifest = tmp_path / "handoff.yaml"
        self.manifest.write_text(yaml.safe_dump({
            "apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
            "metadata": {"name": "fill", "namespace": "bq"},
            "spec": {"source": {"bootstrapServers": bootstrap, "topics": [topic], "maxRecordsPerBatch": 300,
                                "startingOffsets": "latest"},
                     "sink": {"bigquery": {"project": bigquery.project, "dataset": f"fill_{uuid.uuid4().hex[:8]}",
                                           "table": "events", "partitionBy": "ts",
                                           "restEndpoint": bigquery.rest_endpoint,
                                           "grpcEndpoint": bigquery.grpc_endpoint}},
                     "schema": {"columns": COLUMNS, "onIncompatible": "halt"}}}))
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "spark_app")]),
                    "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        printed = self.handoff("run", "--print-config")
        assert printed.returncode == 0, printed.stderr
        (tmp_path / "app.json").write_text(printed.stdout)
        self.cfg = AppConfig.model_validate_json(printed.stdout)

    def handoff(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "handoff_operator", *args, "-f", str(self.manifest),
                               "--checkpoint", self.checkpoint], capture_output=True, text=True, env=self.env,
                              cwd=self.tmp_path, timeout=timeout)

    def run(self) -> str:
        return _ok(self.handoff("run", "--available-now"))

    def replay(self, name: str, start: dict[int, int], end: dict[int, int], dry: bool = False
               ) -> subprocess.CompletedProcess[str]:
        request = self.tmp_path / f"{name}.yaml"
        request.write_text(yaml.safe_dump({
            "apiVersion": "handoff.io/v1alpha1", "kind": "ReplayRequest", "metadata": {"name": name, "namespace": "bq"},
            "spec": {"handoffRef": {"name": "fill"}, "mode": "Backfill", "dryRun": dry,
                     "from": {self.topic: {str(p): o for p, o in start.items()}},
                     "to": {self.topic: {str(p): o for p, o in end.items()}}}}))
        return self.handoff("replay", "-r", str(request), timeout=120)

    def backfill(self, printed: str) -> subprocess.CompletedProcess[str]:
        """The command `handoff replay` printed for a Backfill, with the app config `--print-config` wrote."""
        line = next(x for x in printed.splitlines() if "python -m handoff_spark backfill" in x)
        argv = shlex.split(line.split("run the backfill with: ", 1)[1].replace("<app.json>", "app.json"))
        assert argv[:3] == ["python", "-m", "handoff_spark"], argv
        return subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, env=self.env,
                              cwd=self.tmp_path, timeout=600)


def _ok(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


def _coverage(cfg: AppConfig, topic: str) -> dict[int, list[tuple[int, int]]]:
    """Each partition's ledger-index ranges (all queries), merged where they touch; overlaps fail."""
    out: dict[int, list[tuple[int, int]]] = {}
    ranges = sorted((p, se) for c in bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)
                    for p, se in c.offsets.get(topic, {}).items() if se[1] > se[0])
    for p, (start, end) in ranges:
        merged = out.setdefault(p, [])
        if merged and merged[-1][1] > start:
            raise AssertionError(f"partition {p}: ledger entries overlap at {start}")
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return out


def test_backfill_writes_the_missing_history_once_and_refuses_overlaps(kafka, bigquery, tmp_path):
    topic = f"fill-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    h = Handoff(tmp_path, bigquery, kafka.bootstrap, topic)
    produced = _produce(kafka.bootstrap, topic, range(600))  # the history the stream will not read
    history = end_offsets(kafka.bootstrap, topic)
    assert all(history.values()) and sum(history.values()) == 600
    h.run()  # starts at latest: reads nothing
    produced += _produce(kafka.bootstrap, topic, range(600, 1000))
    h.run()
    stream_end = end_offsets(kafka.bootstrap, topic)
    assert table_counts(h.cfg) == (400, 400)
    group = committed_group_offsets(kafka.bootstrap, h.cfg.consumer_group, [(topic, p) for p in stream_end])
    assert group == {topic: stream_end}

    # the plan refuses a range the table partly holds (the stream's index rows), nothing changes
    everything = h.replay("too-much", {p: 0 for p in history}, stream_end)
    assert everything.returncode == 2, everything.stdout + everything.stderr
    lines = everything.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("refused (BackfillOverlap): spec.from/to: the table already "
                                                   "holds part of the range:"), everything.stdout
    assert "backfill only offsets the table lacks" in lines[0]

    # the driver refuses it too, from the data table itself, before writing anything
    first = min(history)
    over = {topic: {str(first): history[first] - 5}}, {topic: {str(first): history[first] + 5}}
    refused = subprocess.run([sys.executable, "-m", "handoff_spark", "backfill", "--config", "app.json", "--query",
                              "backfill-over", "--from", json.dumps(over[0]), "--to", json.dumps(over[1])],
                             capture_output=True, text=True, env=h.env, cwd=tmp_path, timeout=600)
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    said = [x for x in refused.stderr.splitlines() if x.startswith("handoff: ")]
    assert len(said) == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert (f"{topic}[{first}] offsets {history[first]}..{history[first] + 4} are already in the table" in said[0]
            and f"{topic}[{first}] has 5 rows in the data table at offsets {history[first]}..{history[first] + 4}"
            in said[0] and "Nothing was written. Fix: backfill only ranges the table does not hold" in said[0]), said
    assert table_counts(h.cfg) == (400, 400)

    dry = h.replay("fill", {p: 0 for p in history}, history, dry=True)
    assert "dry run: nothing changed" in _ok(dry) and "re-read 600 records" in dry.stdout
    planned = _ok(h.replay("fill", {p: 0 for p in history}, history))
    assert "re-read 600 records" in planned and "--query backfill-fill" in planned
    _ok(h.backfill(planned))
    assert table_counts(h.cfg) == (produced, produced)

    # under its own ledger query; the stream's position and consumer group did not move
    entries = bigquery_ledger.list_commits(h.cfg.sink, h.cfg.handoff_id)
    assert {c.query for c in entries} == {"handoff", "backfill-fill"}
    backfilled = bigquery_ledger.ends(entries, {}, "backfill-fill")
    assert backfilled == {topic: history}
    assert bigquery_ledger.ends(entries, {}, "handoff") == {topic: stream_end}
    assert committed_group_offsets(kafka.bootstrap, h.cfg.consumer_group, [(topic, p) for p in stream_end]) \
        == {topic: stream_end}
    assert _coverage(h.cfg, topic) == {p: [(0, e)] for p, e in stream_end.items()}

    # the same command again: it resumes from its own ledger rows, finds the range done, writes nothing
    _ok(h.backfill(planned))
    assert table_counts(h.cfg) == (produced, produced)
    # and the request again is refused: the backfill's rows hold the range now
    again = h.replay("fill-again", {p: 0 for p in history}, history)
    assert again.returncode == 2 and "refused (BackfillOverlap)" in again.stdout and "backfill-fill" in again.stdout

    # the stream goes on from where it was
    produced += _produce(kafka.bootstrap, topic, range(1000, 1100))
    h.run()
    assert table_counts(h.cfg) == (produced, produced)
    assert bigquery_ledger.resume_offsets(h.cfg.sink, h.cfg.handoff_id)[topic] == end_offsets(kafka.bootstrap, topic)
    assert _coverage(h.cfg, topic) == {p: [(0, e)] for p, e in end_offsets(kafka.bootstrap, topic).items()}
