"""Does a dedupe's batch cost grow with the window of keys it keeps (issue 31)?

`spec.dedupe.within: 1h` keeps every key of the last hour in Spark's state store. Spark's
`dropDuplicatesWithinWatermark` looks each record's key up (one read per record), and at the end of each batch
evicts the keys whose window has passed. If the eviction, or RocksDB itself, costs per key *kept* rather than per
record *read*, a handoff's batches slow down as its window fills, and a busy topic with a long window falls behind.

One topic of N distinct orders (ids 0..N-1, event times 1 ms apart, so all N fit in the hour and nothing is
evicted), read by what `driver.app.start_query` runs for such a spec in one AvailableNow run with
`maxRecordsPerBatch` = B (N/B batches, the state growing by B keys a batch), into the product's Iceberg sink:
- `dedupe`: the bench's SQL (`dataframe_path.SQL`), event time on `ts` and a dedupe on `id` within an hour;
- `no-dedupe` (the baseline in the same run): the same SQL and event time, no dedupe: the batch's cost without
  any state;
- `dedupe-changelog`: `dedupe` with RocksDB's changelog checkpointing (a batch's state commit writes its changes,
  snapshots are made in the background), against Spark's default (`dedupe`: every commit makes a snapshot);
- `dedupe-8partitions` (`--pipelines`): `dedupe` with a cluster's 8 shuffle partitions instead of a local master's
  one per core (`driver.app.frame_path_conf`).
Per batch it keeps Spark's own figures (the query's progress: durations, the state operator's rows and its
update/removal/commit times). The table prints the batches in groups by the records read before them (the dedupe's
state then holds the ~90 % of them the SQL keeps). Every table is checked: rows == distinct ids == the orders the
SQL keeps.

    .venv/bin/python bench/spark/sink/dedupe_window.py [--records 600000] [--batch 20000]

Prints a table and writes bench/results/dedupe_window.json.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "spark_app"))
sys.path.insert(0, str(ROOT / "hack"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(HERE))

from bench_kafka import add_broker_argument, broker  # noqa: E402
from bench_pipelines import produce  # noqa: E402
from bench_report import add_out_argument, machine_facts, write_json  # noqa: E402
from dataframe_path import DEDUPE_KEY, MIN_AMOUNT, SQL, make_cfg, order, table_check  # noqa: E402

PIPELINES = ("no-dedupe", "dedupe", "dedupe-changelog")
KNOWN_PIPELINES = (*PIPELINES, "dedupe-8partitions")
SHUFFLE_KEY = "spark.sql.shuffle.partitions"
#: The shuffle partitions `dedupe-8partitions` runs with (a cluster's, `driver.app.FRAME_SHUFFLE_PARTITIONS`).
CLUSTER_PARTITIONS = "8"
#: RocksDB's changelog checkpointing: a batch's state commit writes the changes only; snapshots are made in the
#: background. Set on the session for the `dedupe-changelog` run only.
CHANGELOG_KEY = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
GROUPS = 5  # the batches are reported in this many groups, by the state's size before them


def pipeline_cfg(cfg: Any, name: str, batch: int) -> Any:
    fields: dict[str, Any] = {"deadLetterTopic": "bench-dedupe-dlq", "transform": {"sql": SQL},
                              "eventTime": {"column": "ts", "watermarkSeconds": 3600}}
    if name.startswith("dedupe"):
        fields["dedupe"] = {"keys": [DEDUPE_KEY], "withinSeconds": 3600}
    doc = {**json.loads(cfg.to_json()), **fields}
    doc["source"] = {**doc["source"], "maxRecordsPerBatch": batch}
    if name == "dedupe-8partitions":  # as a user's own setting, which the product leaves as it is
        doc["sparkConf"] = {**doc.get("sparkConf", {}), SHUFFLE_KEY: CLUSTER_PARTITIONS}
    return type(cfg).model_validate(doc)


def batches_of(query: Any) -> list[dict[str, Any]]:
    """Each data batch of the query's progress: its records, wall time, addBatch time and the dedupe's state."""
    out = []
    for p in query.recentProgress:
        rows = int(p.get("numInputRows") or 0)
        if rows == 0:
            continue
        state = (p.get("stateOperators") or [{}])[0]
        custom = state.get("customMetrics") or {}
        durations = p.get("durationMs") or {}
        out.append({"batch": p["batchId"], "records": rows, "ms": durations.get("triggerExecution"),
                    "add_batch_ms": durations.get("addBatch"), "state_rows_updated": state.get("numRowsUpdated"),
                    "state_update_ms": state.get("allUpdatesTimeMs"), "state_removal_ms": state.get("allRemovalsTimeMs"),
                    "state_commit_ms": state.get("commitTimeMs"), "dropped": custom.get("numDroppedDuplicateRows")})
    return out


def run_pipeline(spark: Any, base: Any, name: str, batch: int, records: int) -> dict[str, Any]:
    from handoff_spark.driver.app import start_query
    from handoff_spark.sink import registry as sinks

    cfg = pipeline_cfg(base, name, batch)
    sinks.get("iceberg").prepare(cfg)
    changelog, shuffle = spark.conf.get(CHANGELOG_KEY, None), spark.conf.get(SHUFFLE_KEY)
    spark.conf.set(CHANGELOG_KEY, "true" if name == "dedupe-changelog" else (changelog or "false"))
    spark.conf.set(SHUFFLE_KEY, cfg.spark_conf.get(SHUFFLE_KEY, shuffle))
    try:
        t = time.perf_counter()
        query = start_query(spark, cfg, available_now=True)
        query.awaitTermination()
        seconds = time.perf_counter() - t
    finally:
        spark.conf.set(CHANGELOG_KEY, changelog or "false")
        spark.conf.set(SHUFFLE_KEY, shuffle)
    batches = batches_of(query)
    read = 0
    for b in batches:  # the records read before the batch: the dedupe's state holds the ~90 % the SQL keeps
        b["records_before"] = read
        read += b["records"]
    check = table_check(cfg, dedupe=True)
    expected = sum(1 for k in range(records) if order(k)["amount"] >= MIN_AMOUNT)
    check["ok"] = check["table_rows"] == check.get("distinct_ids") == expected
    return {"seconds": seconds, "batches": batches, "check": check,
            SHUFFLE_KEY: cfg.spark_conf.get(SHUFFLE_KEY, shuffle)}


def spark_part(bootstrap: str, topic: str, records: int, batch: int, out: str,
               pipelines: tuple[str, ...] = PIPELINES) -> None:
    """Both pipelines in one Spark session (C2: the DataFrame path's JIT), the baseline first."""
    import os

    from handoff_spark.driver.app import build_session

    os.environ["HANDOFF_JVM_C1_ONLY"] = "0"
    tmp = Path(tempfile.mkdtemp(prefix="bench-dedupe-window-"))
    try:
        # The dedupe's cfg builds the session: RocksDB and the product's other settings for it (frame_path_conf).
        session_cfg = pipeline_cfg(make_cfg(bootstrap, topic, tmp, "session"), "dedupe", batch)
        session_cfg = type(session_cfg).model_validate({**json.loads(session_cfg.to_json()),
                                                        "sparkConf": {"spark.master": "local[2]"}})
        spark = build_session(session_cfg)
        results: dict[str, Any] = {"_conf": {k: spark.conf.get(k, None) for k in (
            "spark.sql.shuffle.partitions", "spark.sql.streaming.stateStore.providerClass",
            "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows", CHANGELOG_KEY)}}
        warm_topic = f"{topic}-warmup"
        for name in pipelines:  # a first small run per pipeline starts its workers and planners
            run_pipeline(spark, make_cfg(bootstrap, warm_topic, tmp, f"warm-{name}"), name, batch, 2 * batch)
        for name in pipelines:
            results[name] = run_pipeline(spark, make_cfg(bootstrap, topic, tmp, name), name, batch, records)
            print(f"  {name}: {results[name]['seconds']:.1f} s, {len(results[name]['batches'])} batches",
                  flush=True)
        spark.stop()
        write_json(out, results)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def grouped(batches: list[dict[str, Any]], groups: int) -> list[dict[str, Any]]:
    """The batches in `groups` runs of consecutive batches (the first batch of a run, which pays the query's start,
    left out): the mean records/s and state times of each."""
    body = batches[1:]
    size = max(1, len(body) // groups)
    out = []
    for i in range(0, len(body), size):
        part = body[i:i + size]
        ms = sum(b["ms"] or 0 for b in part)
        out.append({"records_before": part[0].get("records_before"), "batches": len(part),
                    "records_per_s": round(sum(b["records"] for b in part) / (ms / 1000)) if ms else None,
                    "ms_per_batch": round(ms / len(part)),
                    "state_update_ms": round(sum(b["state_update_ms"] or 0 for b in part) / len(part)),
                    "state_removal_ms": round(sum(b["state_removal_ms"] or 0 for b in part) / len(part)),
                    "state_commit_ms": round(sum(b["state_commit_ms"] or 0 for b in part) / len(part))})
    return out[:groups]


def main(argv: list[str] | None = None) -> int:
    import subprocess

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=600_000)
    ap.add_argument("--batch", type=int, default=20_000, help="maxRecordsPerBatch")
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--pipelines", default=",".join(PIPELINES), help=f"of {', '.join(KNOWN_PIPELINES)}, in this order")
    add_broker_argument(ap)
    add_out_argument(ap, "dedupe_window.json")
    ap.add_argument("--spark-part", help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.records > 3_600_000:
        ap.error("--records: at most 3600000 (the orders' event times, 1 ms apart, must fit in the hour)")
    pipelines = tuple(p for p in args.pipelines.split(",") if p)
    if set(pipelines) - set(KNOWN_PIPELINES):
        ap.error(f"--pipelines: unknown {sorted(set(pipelines) - set(KNOWN_PIPELINES))}; known: "
                 f"{', '.join(KNOWN_PIPELINES)}")
    if args.spark_part:
        spark_part(args.bootstrap, args.topic, args.records, args.batch, args.spark_part, pipelines)
        return 0

    stack = contextlib.ExitStack()
    bootstrap, _kafka = stack.enter_context(broker(args.bootstrap))
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        topic = f"bench-dedupe-window-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for name, n in ((topic, args.records), (f"{topic}-warmup", 2 * args.batch)):
            admin.create_topics([NewTopic(name, args.partitions, 1)])[name].result(30)
            time.sleep(1)
            produce(bootstrap, name, n, lambda i: json.dumps(order(i)).encode())
        print(f"produced {args.records} distinct orders to {topic}", flush=True)
        with tempfile.NamedTemporaryFile(suffix=".json") as part:
            done = subprocess.run([sys.executable, __file__, "--spark-part", part.name, "--topic", topic,
                                   "--bootstrap", bootstrap, "--records", str(args.records), "--batch",
                                   str(args.batch), "--pipelines", ",".join(pipelines)])
            if done.returncode != 0:
                print(f"the Spark process exited {done.returncode}", file=sys.stderr)
                return 1
            results = json.loads(Path(part.name).read_text())
    finally:
        stack.close()

    conf = results.pop("_conf")
    doc = {"records": args.records, "batch": args.batch, "partitions": args.partitions, "session_conf": conf,
           **machine_facts(), "results": results,
           "groups": {name: grouped(results[name]["batches"], GROUPS) for name in pipelines}}
    write_json(args.out, doc)
    print(f"\n{args.records} distinct orders in batches of {args.batch} (state: {conf})\n")
    print(f"{'pipeline':<16} {'read before':>11} {'batches':>7} {'records/s':>10} {'ms/batch':>8} "
          f"{'update ms':>9} {'removal ms':>10} {'commit ms':>9}")
    for name in pipelines:
        for g in doc["groups"][name]:
            print(f"{name:<16} {g['records_before'] or 0:>11} {g['batches']:>7} {g['records_per_s'] or 0:>10} "
                  f"{g['ms_per_batch']:>8} {g['state_update_ms']:>9} {g['state_removal_ms']:>10} "
                  f"{g['state_commit_ms']:>9}")
        print(f"{name:<16} whole run {results[name]['seconds']:.1f} s, table check: {results[name]['check']}")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
