"""Commit latency of the Iceberg sink's table commit as history grows: at batch 1, 100, 500 and 1000, for
  * `baseline` — a naive PyIceberg sink: plain SqlCatalog, plain Transaction, fast_append, no manifest
    merging, no expiry;
  * `handoff-no-maintenance` — Handoff's commit path (iceberg_catalog.HandoffSqlCatalog: metadata parsed once
    per version, updates staged without a deep copy; memoised transaction metadata; merge_append with
    `commit.manifest-merge.enabled`) but no maintenance;
  * `handoff` — plus Handoff's maintenance every 25 batches (expire snapshots outside the replay window,
    compact small files, orphan sweep), the replay window being the last 50 batches.
Why the history matters: PyIceberg deep-copies the whole table metadata whenever it applies updates and parses
the metadata JSON on every load (twice per commit), so a plain commit costs O(snapshots retained); see
iceberg_catalog and iceberg_sink._MemoTransaction.

Each batch is what the sink's driver does (`iceberg_sink.commit_to_table`: load table, ancestry check, one
snapshot with the ledger properties) for one small pre-written data file, on a SQLite catalog. The figure at
batch N is the median of the 10 commits ending at N (@1: commits 2-11) in wall time (`median_ms_at`) and in
this process's CPU time (`median_cpu_ms_at`: what the commit computes, less sensitive to other jobs on a shared
machine and to fsync waits). Prints a table, writes bench/results/commit_latency.json.

    .venv/bin/python bench/spark/iceberg/commit_latency.py [--batches 1000] [--variants baseline,merge,merge+expire]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "spark_app"))

from handoff_spark.iceberg import maintenance  # noqa: E402
from handoff_spark.config import AppConfig  # noqa: E402
from handoff_spark.iceberg.sink import IcebergCommitMessage, commit_to_table, open_table, write_data_files  # noqa: E402

POINTS = (1, 100, 500, 1000)
import handoff_spark.iceberg.sink as _sink  # noqa: E402
_MEMO = _sink._MemoTransaction
WINDOW_BATCHES = 50


def _config(tmp: Path, variant: str) -> AppConfig:
    return AppConfig.model_validate({
        "handoffId": f"bench/{variant}", "source": {"bootstrapServers": "unused:9092", "topics": ["t"]},
        "sink": {"kind": "iceberg", "catalogName": "bench", "table": "bench.t",
                 "catalogProperties": {"type": "sql", "uri": f"sqlite:///{tmp}/catalog.db",
                                       "warehouse": f"file://{tmp}/warehouse"},
                 "partitionBy": ["day(ts)"]},
        "schema": {"columns": [{"name": "id", "type": "long"}, {"name": "ts", "type": "timestamp"},
                               {"name": "payload", "type": "string"}], "onIncompatible": "halt"},
        "checkpointLocation": str(tmp / "cp"),
        "maintenance": {"everyBatches": 25, "expireOlderThanSeconds": 1, "orphanMinAgeSeconds": 60},
    })


def _rows(batch: int, n: int = 200) -> pa.Table:
    ts = pa.array([1_767_225_600_000_000 + batch * 1_000_000] * n, pa.timestamp("us", "UTC"))
    return pa.table({"id": pa.array(range(batch * n, batch * n + n), pa.int64()), "ts": ts,
                     "payload": [f"p{i}" for i in range(n)],
                     "_kafka_topic": ["t"] * n, "_kafka_partition": pa.array([0] * n, pa.int32()),
                     "_kafka_offset": pa.array(range(batch * n, batch * n + n), pa.int64()), "_kafka_timestamp": ts})


def run_variant(variant: str, batches: int, window: int = WINDOW_BATCHES) -> dict[str, object]:
    from handoff_spark.iceberg.sink import prepare_batch

    with tempfile.TemporaryDirectory(prefix=f"bench-{variant}-") as d:
        tmp = Path(d)
        cfg = _config(tmp, variant)
        if variant == "handoff":  # upkeep twice per window
            cfg = cfg.model_copy(update={"maintenance": cfg.maintenance.model_copy(
                update={"every_batches": max(1, window // 2)})})
        if variant == "baseline":  # the naive sink loads tables through PyIceberg's own SqlCatalog
            from handoff_spark.iceberg import table as iceberg_table
            from pyiceberg.catalog import load_catalog
            props = cfg.sink.catalog_properties
            iceberg_table._catalogs[(cfg.sink.catalog_name, tuple(sorted(props.items())))] = load_catalog(
                cfg.sink.catalog_name, **props)
        table = open_table(cfg)
        import handoff_spark.iceberg.sink as sink_mod
        from pyiceberg.table import Transaction
        sink_mod._MemoTransaction = Transaction if variant == "baseline" else _MEMO  # type: ignore[misc]
        if variant == "baseline":
            with table.transaction() as tx:
                tx.set_properties({"commit.manifest-merge.enabled": "false"})
        latencies: list[float] = []
        cpu: list[float] = []
        maint_ms: list[float] = []
        window_start = time.time()
        load_start = os.getloadavg()[0]
        batch_times: list[float] = []
        for b in range(batches):
            table = open_table(cfg)
            shaped, meta, _plan = prepare_batch(_rows(b), table.metadata, "compatible")
            files = write_data_files(meta, table.io, shaped, uuid.uuid4())
            msg = IcebergCommitMessage(write_uuid="x", files=files, rows=shaped.num_rows)
            ranges = {("t", 0): (b * 200, b * 200 + 200)}
            c0, t0 = time.process_time(), time.perf_counter()
            tc = commit_to_table(cfg, [msg], b, ranges, "bench-query")
            latencies.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
            batch_times.append(time.time())
            if variant == "handoff" and b and b % cfg.maintenance.every_batches == 0:
                # replay window = the last `window` batches: expire what is older than batch b - window
                t1 = time.perf_counter()
                t = tc.table
                maintenance.expire_snapshots(t, 0, now_ms=int(batch_times[max(0, b - window)] * 1000))
                t.refresh()
                maintenance.compact(t)
                t.refresh()
                maintenance.remove_orphan_files(t, 60)
                maint_ms.append((time.perf_counter() - t1) * 1000)
        # @1 = commits 2..11 (the very first also warms caches), @N = the 10 commits ending at N
        def medians(xs: list[float]) -> dict[str, float]:
            return {str(p): round(statistics.median(xs[1:11] if p == 1 else xs[p - 10:p]), 1)
                    for p in POINTS if p <= batches}

        at, cpu_at = medians(latencies), medians(cpu)
        last = str(max(int(k) for k in at))
        final = open_table(cfg)
        meta_dir = Path(final.metadata_location.removeprefix("file://")).parent
        return {"variant": variant, "batches": batches, "replay_window_batches": window if variant == "handoff" else None,
                "median_ms_at": at, "median_cpu_ms_at": cpu_at,
                "ratio_last_to_first": round(at[last] / at["1"], 2),
                "cpu_ratio_last_to_first": round(cpu_at[last] / cpu_at["1"], 2),
                "load_avg_1m_at_start_end": [round(load_start, 2), round(os.getloadavg()[0], 2)],
                "metadata_log_entries": len(final.metadata.metadata_log),
                "metadata_json_files": len(list(meta_dir.glob("*.metadata.json"))),
                "snapshots_in_metadata": len(final.metadata.snapshots),
                "live_data_files": len(maintenance.live_data_files(final)),
                "manifests_in_current": len(final.current_snapshot().manifests(final.io)),
                "maintenance_round_ms_median": round(statistics.median(maint_ms), 1) if maint_ms else None,
                "rows": final.scan().to_arrow().num_rows, "elapsed_s": round(time.time() - window_start, 1)}


def _save(results: list[dict[str, object]], name: str = "commit_latency.json") -> None:
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(
        {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": results}, indent=2))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=1000)
    ap.add_argument("--variants", default="handoff,handoff-no-maintenance,baseline",
                    help="comma-separated; NAME:BATCHES caps one variant (the baseline is quadratic)")
    ap.add_argument("--window", type=int, default=WINDOW_BATCHES, help="replay window in batches (handoff)")
    ap.add_argument("--out", default="commit_latency.json", help="file name under bench/results/")
    args = ap.parse_args()
    results = []
    for spec in args.variants.split(","):
        v, _, n = spec.partition(":")
        r = run_variant(v, int(n) if n else args.batches, args.window)
        results.append(r)
        print(json.dumps(r), flush=True)
        _save(results, args.out)
    points = [p for p in POINTS if p <= args.batches]
    print("\ncommit latency (median ms over the 10 commits ending at batch N)")
    print(f"{'variant':<30}" + "".join(f"{'@' + str(p):>9}" for p in points) + f"{'ratio':>8}{'snaps':>7}{'files':>7}")
    for r in results:
        for key, ratio, label in (("median_ms_at", "ratio_last_to_first", ""),
                                  ("median_cpu_ms_at", "cpu_ratio_last_to_first", " (cpu)")):
            at = r[key]
            print(f"{r['variant'] + label:<30}" + "".join(f"{at.get(str(p), '-'):>9}" for p in points)
                  + f"{r[ratio]:>8}{r['snapshots_in_metadata']:>7}{r['live_data_files']:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
