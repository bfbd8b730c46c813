"""Time to roll back and replay N records, beside the plain time to consume the same N records once.

Setup: a seed of `--seed` records is committed first (snapshot S0), then `--records` more are produced.
  * baseline, `consume once`: the Handoff app (`python -m handoff_spark run --config app.json --available-now`,
    Spark local mode, SQLite catalog) reads the N records after S0 into the table, from its checkpoint;
  * `rollback + replay`: a RollbackAndReplay to S0 (the operator's own plan and table steps, through
    `handoff_operator.replay.local`: plan, undo tag, rollback) and the same app started again, which finds its
    checkpoint disagreeing with the ledger, resumes from the ledger and re-reads the same N records.
Both runs pay one Spark start-up; the ratio is replay / once (the goal: ≤ 1.5). The table is checked after the
replay: rows == distinct (partition, offset) == seed + N.
`--sink bigquery`: the same on the test bed's BigQuery emulator (the rollback: undo snapshot tables and the
one-transaction DELETE of `bigquery.rollback`; S0 is the seed's newest ledger entry). Figures from the emulator say
how Handoff's side scales, not what BigQuery would take.
Prints a table and writes bench/results/replay.json (bigquery: replay_bigquery.json).

    .venv/bin/python bench/operator/replay/replay.py [--records 1000000] [--partitions 3] [--bootstrap HOST:PORT]
        [--sink iceberg|bigquery]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "spark_app"))
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT / "hack"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_kafka import add_broker_argument, broker  # noqa: E402
from bench_report import add_out_argument, machine_facts, write_json  # noqa: E402
from bench_pipelines import produce  # noqa: E402

COLUMNS = [{"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamp"},
           {"name": "customer", "type": "string"}, {"name": "amount", "type": "double"},
           {"name": "region", "type": "string"}, {"name": "note", "type": "string"}]


#: Spark's Python worker must connect back within a fixed 10 s; on an overloaded machine it sometimes does not and
#: the query fails before its first batch. Such a run is started again (and not timed); other failures end the bench.
WORKER_TIMEOUT = "Python worker failed to connect back"
RESTARTS: list[str] = []


BATCH = re.compile(r"^(?:bootstrap )?batch \d+: (\d+) rows in (\d+) ms", re.M)


def run_app(app_json: Path, log: Path, tries: int = 3) -> dict[str, Any]:
    """One `--available-now` run of the app: its wall seconds, and from its log the batches (rows, the sum of
    their `triggerExecution`; on Iceberg the bootstrap batch, written before Spark starts, counts too); the rest
    of the wall time is the process's start-up (JVM, Spark session, table preparation, checkpoint check) and
    shutdown."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "spark_app"), str(ROOT / "hack")]),
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    for _ in range(tries):
        start = log.stat().st_size if log.exists() else 0
        t = time.perf_counter()
        with log.open("a") as fh:
            rc = subprocess.call([sys.executable, "-m", "handoff_spark", "run", "--config", str(app_json),
                                  "--available-now"], stdout=fh, stderr=subprocess.STDOUT, env=env)
        seconds = time.perf_counter() - t
        with log.open() as fh:
            fh.seek(start)
            text = fh.read()
        if rc == 0:
            batches = [(int(rows), int(ms)) for rows, ms in BATCH.findall(text)]
            in_batches = sum(ms for _, ms in batches) / 1000
            return {"seconds": round(seconds, 2), "batches": len(batches), "rows": sum(r for r, _ in batches),
                    "batch_seconds": round(in_batches, 2), "outside_batches_seconds": round(seconds - in_batches, 2)}
        if WORKER_TIMEOUT not in text:
            break
        RESTARTS.append(f"{app_json.name}: started again after {seconds:.0f} s ({WORKER_TIMEOUT})")
        print(RESTARTS[-1], flush=True)
    raise SystemExit(f"the app exited {rc}; see {log}")


def _head(cfg: Any) -> int:
    """The table's newest ledger entry: the Iceberg snapshot, or BigQuery's ledger key (`target.snapshotId`)."""
    if cfg.sink.kind == "bigquery":
        from handoff_spark.bigquery import ledger as bigquery_ledger, rollback

        return rollback.entry_key(bigquery_ledger.list_commits(cfg.sink, cfg.handoff_id)[0])
    from handoff_spark.iceberg import ledger

    return ledger.load_table("bench", dict(cfg.sink.catalog_properties), "bench.replay").metadata.current_snapshot_id


def _counts(cfg: Any) -> tuple[int, int]:
    """(rows, distinct (partition, offset)) of the table."""
    if cfg.sink.kind == "bigquery":
        from handoff_spark.bigquery import client as bigquery_client

        sql = (f"SELECT COUNT(*) AS n, COUNT(DISTINCT CONCAT(CAST(_kafka_partition AS STRING), ':', "
               f"CAST(_kafka_offset AS STRING))) AS d FROM `{bigquery_client.table_ref(cfg.sink)}`")
        row = list(bigquery_client.rest_client(cfg.sink).query(sql).result())[0]
        return int(row["n"]), int(row["d"])
    from handoff_spark.iceberg import ledger

    table = ledger.load_table("bench", dict(cfg.sink.catalog_properties), "bench.replay")
    data = table.scan(selected_fields=("_kafka_partition", "_kafka_offset")).to_arrow()
    return data.num_rows, len(set(zip(data["_kafka_partition"].to_pylist(), data["_kafka_offset"].to_pylist())))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--sink", choices=("iceberg", "bigquery"), default="iceberg")
    add_broker_argument(ap)
    add_out_argument(ap, "replay.json")
    args = ap.parse_args(argv)
    if args.sink == "bigquery" and Path(args.out).name == "replay.json":
        args.out = str(Path(args.out).with_name("replay_bigquery.json"))
    with broker(args.bootstrap) as (bootstrap, kafka), contextlib.ExitStack() as stack:
        from confluent_kafka.admin import AdminClient, NewTopic

        from handoff_operator.replay.local import replay
        from handoff_spark.config import AppConfig

        topic = f"replay-{uuid.uuid4().hex[:6]}"
        if kafka is not None:
            kafka.create_topic(topic, partitions=args.partitions)   # waits for the partitions' leaders
        else:
            admin = AdminClient({"bootstrap.servers": bootstrap})
            admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
            time.sleep(1)
        tmp = Path(tempfile.mkdtemp(prefix="bench-replay-"))
        sink: dict[str, Any] = {"kind": "iceberg", "catalogName": "bench",
                                "catalogProperties": {"type": "sql", "uri": f"sqlite:///{tmp}/catalog.db",
                                                      "warehouse": f"file://{tmp}/warehouse"},
                                "table": "bench.replay"}
        if args.sink == "bigquery":
            from handoff_testbed.bigquery import BigQueryEmulator

            emu = BigQueryEmulator()
            emu.build()
            emu.start(tmp / "bqemulator")
            stack.callback(emu.stop)
            sink = {"kind": "bigquery", "project": emu.project, "dataset": "bench", "table": "replay",
                    "restEndpoint": emu.rest_endpoint, "grpcEndpoint": emu.grpc_endpoint}
        cfg = AppConfig.model_validate({
            "handoffId": "bench/replay", "source": {"bootstrapServers": bootstrap, "topics": [topic]},
            "sink": sink,
            "schema": {"columns": COLUMNS, "onIncompatible": "halt"},
            "checkpointLocation": str(tmp / "checkpoint"), "triggerIntervalSeconds": 0,
            "sparkConf": {"spark.master": "local[2]", "spark.sql.shuffle.partitions": "2"}})
        app_json = tmp / "app.json"
        app_json.write_text(cfg.to_json())
        log = tmp / "app.log"

        produce(bootstrap, topic, args.seed)
        run_app(app_json, log)
        seed_snapshot = _head(cfg)
        produce(bootstrap, topic, args.records)
        load_before = os.getloadavg()
        first = run_app(app_json, log)
        once = first["seconds"]
        print(f"consume once: {args.records:,} records in {once:.1f} s", flush=True)

        # The replay's own steps, timed by when the operator's code says it finished each: the plan (table facts,
        # Kafka offsets, the plan), the undo point (Iceberg tag; BigQuery snapshot tables), the rollback.
        t = time.perf_counter()
        lines: list[str] = []
        marks: list[tuple[float, str]] = []

        def echo(line: str) -> None:
            lines.append(line)
            marks.append((time.perf_counter() - t, line))

        rc = replay(cfg, {"metadata": {"name": "bench", "namespace": "bench"},
                          "spec": {"handoffRef": {"name": "replay"}, "mode": "RollbackAndReplay",
                                   "target": {"snapshotId": seed_snapshot}}}, echo=echo)
        rollback = time.perf_counter() - t
        if rc != 0:
            raise SystemExit("replay refused: " + "; ".join(lines))
        steps: dict[str, float] = {}
        last = 0.0
        for at, line in marks:
            step = ("plan" if line.startswith("plan:") else "undo_point" if line.startswith("kept snapshot")
                    else "rollback" if line.startswith("rolled the table back") else None)
            if step:
                steps[step] = round(at - last, 3)
                last = at
        second = run_app(app_json, log)
        reread = second["seconds"]
        total = rollback + reread
        print(f"rollback + replay: {rollback:.2f} s + {reread:.1f} s", flush=True)

        rows, distinct = _counts(cfg)
        whole = rows == distinct == args.seed + args.records
        results: dict[str, Any] = {
            "sink": args.sink, "records": args.records, "partitions": args.partitions,
            "consume_once_seconds": round(once, 2), "rollback_seconds": round(rollback, 3),
            "replay_seconds": round(reread, 2), "rollback_and_replay_seconds": round(total, 2),
            "ratio": round(total / once, 2), "table_whole_after_replay": whole,
            "table_rows": rows, "table_distinct_offsets": distinct,
            "rollback_steps_seconds": steps,
            "consume_once_run": first, "replay_run": second,
            "plan": [line for line in lines if line.startswith("plan:")],
            "restarts_not_timed": RESTARTS,
            **machine_facts(), "load_avg_before": load_before,
        }
        print(f"\n| run | seconds | records/s |\n|---|---|---|\n"
              f"| consume once (baseline) | {once:.1f} | {args.records / once:,.0f} |\n"
              f"| rollback + replay | {total:.1f} | {args.records / total:,.0f} |\n"
              f"\nratio {total / once:.2f} (goal ≤ 1.5); table whole after the replay: {whole}\n"
              f"replay steps (s): {steps}; in batches / outside (s): once {first['batch_seconds']} / "
              f"{first['outside_batches_seconds']}, replay {second['batch_seconds']} / "
              f"{second['outside_batches_seconds']}; load average {load_before} → {os.getloadavg()}")
        write_json(args.out, results)
        return 0 if whole else 1


if __name__ == "__main__":
    sys.exit(main())
