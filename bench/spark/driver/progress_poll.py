"""What watching a streaming query's progress costs a long-running driver (`driver.app.ProgressReporter.poll`).

The driver polls its query twice a second for finished batches. The baseline is the reporter before 2026-11-28,
which read `query.recentProgress` on every poll: Spark keeps the last 100 progresses
(`spark.sql.streaming.numRecentProgressUpdates`) and PySpark fetches each one's JSON through py4j, so the JVM
serialises up to 100 progresses per poll whether a batch finished or not. The product's reporter reads
`query.lastProgress` and the whole list only when a batch went by unseen.

One local[1] session in this process: a `rate` query into `noop` runs fast until Spark retains `--retained`
progresses, then stops (a stopped query's progress stays readable, as a driver between batches sees it). Each
method then polls `--polls` times; measured: the JVM's CPU (user + system from /proc, the py4j threads that build
the JSON) and this process's CPU per poll, and the share of one core both take at two polls a second. Each
method's pass alternates with the other's (`--rounds`), so a busy machine hits both alike.

    .venv/bin/python bench/spark/driver/progress_poll.py [--polls 100] [--rounds 2]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "spark_app")]

from bench_report import machine_facts, write_json  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")
POLLS_PER_SECOND = 2  # driver.app's loop: query.awaitTermination(0.5) between polls


def jvm_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def measure(poll: Callable[[], Any], polls: int, jvm_pid: int) -> dict[str, float]:
    jvm0, py0, wall0 = jvm_cpu_s(jvm_pid), time.process_time(), time.perf_counter()
    for _ in range(polls):
        poll()
    jvm, py, wall = jvm_cpu_s(jvm_pid) - jvm0, time.process_time() - py0, time.perf_counter() - wall0
    per_poll_ms = (jvm + py) / polls * 1000
    return {"jvm_cpu_ms_per_poll": jvm / polls * 1000, "python_cpu_ms_per_poll": py / polls * 1000,
            "wall_ms_per_poll": wall / polls * 1000,
            "core_share_at_2_polls_per_s": per_poll_ms * POLLS_PER_SECOND / 1000}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--polls", type=int, default=100, help="polls per method and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--retained", type=int, default=100, help="progresses Spark retains (its default: 100)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "progress_poll.json"))
    args = ap.parse_args(argv)

    from pyspark.sql import SparkSession

    from handoff_spark import pyspark_private
    from handoff_spark.config import AppConfig
    from handoff_spark.driver.app import ProgressReporter

    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.streaming.numRecentProgressUpdates", str(args.retained)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    jvm_pid = pyspark_private.gateway_process(spark.sparkContext).pid
    checkpoint = tempfile.mkdtemp(prefix="bench-progress-")
    query = (spark.readStream.format("rate").option("rowsPerSecond", 1000).load().writeStream.format("noop")
             .option("checkpointLocation", checkpoint).trigger(processingTime="10 milliseconds").start())
    while (query.lastProgress or {}).get("batchId", -1) < args.retained:  # ~1 batch/s here: a minute or two
        time.sleep(1)
    query.stop()
    retained = len(query.recentProgress)

    cfg = AppConfig.model_validate({"handoffId": "bench/progress", "checkpointLocation": checkpoint,
                                    "source": {"bootstrapServers": "127.0.0.1:1", "topics": ["t"]},
                                    "sink": {"kind": "iceberg", "table": "db.t"}, "schema": {"onIncompatible": "halt"}})
    reporter = ProgressReporter(cfg, None, lambda line: None)
    reporter.poll(query)  # reports the retained batches once, as the driver did while they ran
    methods: dict[str, Callable[[], Any]] = {
        "baseline: recentProgress every poll": lambda: query.recentProgress,
        "ProgressReporter.poll": lambda: reporter.poll(query),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in methods}
    for _ in range(args.rounds):
        for name, poll in methods.items():
            runs[name].append(measure(poll, args.polls, jvm_pid))
    spark.stop()

    best = {name: min(rs, key=lambda r: r["jvm_cpu_ms_per_poll"] + r["python_cpu_ms_per_poll"])
            for name, rs in runs.items()}
    doc = {**machine_facts(), "retained_progresses": retained, "polls": args.polls, "rounds": args.rounds,
           "best": best, "runs": runs}
    write_json(args.out, doc)
    print(f"\n{retained} progresses retained, {args.polls} polls x {args.rounds} rounds, best round:")
    print(f"| method | JVM CPU ms/poll | Python CPU ms/poll | wall ms/poll | share of a core at 2 polls/s |\n"
          f"|---|---:|---:|---:|---:|")
    for name, r in best.items():
        print(f"| {name} | {r['jvm_cpu_ms_per_poll']:.2f} | {r['python_cpu_ms_per_poll']:.2f} | "
              f"{r['wall_ms_per_poll']:.2f} | {r['core_share_at_2_polls_per_s']:.1%} |")
    print(f"load average {os.getloadavg()}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
