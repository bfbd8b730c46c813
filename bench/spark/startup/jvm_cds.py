"""What a class-data-sharing archive of Spark's classes saves a starting JVM (`handoff_spark.startup.jvm_cds`).

Writes an archive (a local session + one query under `-XX:ArchiveClassesAtExit`), then alternates `--pairs`
runs without and with it; each run is a fresh process: a local[1] session start and one tiny query, reporting
wall times and the JVM's own CPU time (user + system from /proc, less sensitive to other jobs than wall time).
Prints a table and writes bench/results/jvm_cds.json.

    .venv/bin/python bench/spark/startup/jvm_cds.py [--pairs 2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

from bench_report import write_json  # noqa: E402

PROBE = """
import json, os, sys, time
from pyspark.sql import SparkSession
opts = sys.argv[1]
t = time.perf_counter()
b = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
     .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1"))
if opts:
    b = b.config("spark.driver.extraJavaOptions", opts)
spark = b.getOrCreate()
t1 = time.perf_counter()
spark.range(1000).selectExpr("sum(id)").collect()
t2 = time.perf_counter()
f = open(f"/proc/{spark.sparkContext._gateway.proc.pid}/stat").read().split(")")[1].split()
print(json.dumps({"session_s": round(t1 - t, 2), "query_s": round(t2 - t1, 2),
                  "jvm_cpu_s": (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")}))
spark.stop()
"""


def probe(opts: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, opts], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "jvm_cds.json"))
    args = ap.parse_args(argv)
    archive = Path(tempfile.mkdtemp(prefix="bench-cds-")) / "spark.jsa"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "spark_app")}
    subprocess.run([sys.executable, "-m", "handoff_spark.startup.jvm_cds", str(archive)], env=env, check=True,
                   capture_output=True)
    load = [os.getloadavg()]
    runs: dict[str, list[dict]] = {"without": [], "with": []}
    for _ in range(args.pairs):
        runs["without"].append(probe(""))
        runs["with"].append(probe(f"-XX:SharedArchiveFile={archive} -Xshare:auto"))
    load.append(os.getloadavg())
    doc = {"archive_mb": round(archive.stat().st_size / 1e6), "load_avg": load, "cpus": os.cpu_count(),
           "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs}
    write_json(args.out, doc)
    print("| archive | session start s | query s | JVM CPU s |\n|---|---|---|---|")
    for name, rs in runs.items():
        print(f"| {name} | {' / '.join(str(r['session_s']) for r in rs)} | "
              f"{' / '.join(str(r['query_s']) for r in rs)} | {' / '.join(str(r['jvm_cpu_s']) for r in rs)} |")
    print(f"archive {doc['archive_mb']} MB; load average {load}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
