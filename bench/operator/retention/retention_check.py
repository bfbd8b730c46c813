"""What one retention check costs, beside what every status refresh already does.

  * `baseline` — `truth.kafka_offsets`: the ListOffsets (latest + earliest) each status refresh makes anyway;
  * `retention-check` — `retention_kafka.topic_facts` with nothing cached: DescribeConfigs, three ListOffsets
    (earliest, latest, by timestamp) and the two record samples (oldest unconsumed record, start of the rate
    window), for a handoff whose ledger is halfway through every partition.

Per partition count: the median and p90 wall time over `--runs` calls on the same warm broker and topic (same
AdminClient, the operator's). Why it matters: the check runs every HANDOFF_RETENTION_CHECK_INTERVAL (300 s), the
baseline every HANDOFF_STATUS_INTERVAL (15 s), so the check's share of the operator's Kafka time is
(check / 300) / (baseline / 15). Prints a table, writes bench/results/retention_check.json.

    .venv/bin/python bench/operator/retention/retention_check.py [--partitions 3,30] [--records 100000] [--runs 20] [--bootstrap HOST:PORT]
"""
from __future__ import annotations

import argparse
import statistics
import sys
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
from bench_report import add_out_argument, write_json  # noqa: E402


def _timed(fn: Any, runs: int) -> dict[str, float]:
    fn()  # warm: connections, metadata
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return {"median_ms": statistics.median(times) * 1000, "p90_ms": times[int(0.9 * (len(times) - 1))] * 1000}


def measure(bootstrap: str, partitions: int, records: int, runs: int) -> dict[str, Any]:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from handoff_operator.retention.kafka import topic_facts
    from handoff_operator.truth.reading import kafka_offsets
    from handoff_spark.config import AppConfig

    topic = f"bench-ret-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held: a dropped client cancels its requests
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    time.sleep(1)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(records):
        producer.produce(topic, b"x" * 200, partition=i % partitions)
        if i % 10000 == 0:
            producer.poll(0)
    producer.flush(60)
    config = AppConfig.model_validate({"handoffId": "bench/ret", "source": {"bootstrapServers": bootstrap,
                                                                              "topics": [topic]},
                                       "sink": {"kind": "iceberg", "table": "bench.x"},
                                       "schema": {"onIncompatible": "halt"}, "checkpointLocation": "/tmp/unused"})
    per = records // partitions
    committed = {topic: {str(p): per // 2 for p in range(partitions)}}
    baseline = _timed(lambda: kafka_offsets(config), runs)
    check = _timed(lambda: topic_facts(config, committed, int(time.time() * 1000), config_max_age=0.0), runs)
    return {"partitions": partitions, "records": records, "runs": runs, "baseline": baseline,
            "retention-check": check, "ratio_median": check["median_ms"] / baseline["median_ms"],
            "share_of_kafka_time_at_default_intervals": (check["median_ms"] / 300) / (baseline["median_ms"] / 15)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", default="3,30")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=20)
    add_broker_argument(ap)
    add_out_argument(ap, "retention_check.json")
    args = ap.parse_args(argv)
    with broker(args.bootstrap) as (bootstrap, _kafka):
        results = [measure(bootstrap, int(p), args.records, args.runs) for p in args.partitions.split(",")]
    print(f"{'partitions':>10} {'baseline ms (p50/p90)':>22} {'retention check ms (p50/p90)':>29} {'ratio':>6} "
          f"{'share @300s/15s':>16}")
    for r in results:
        b, c = r["baseline"], r["retention-check"]
        print(f"{r['partitions']:>10} {b['median_ms']:>12.1f} / {b['p90_ms']:<7.1f} {c['median_ms']:>17.1f} / "
              f"{c['p90_ms']:<9.1f} {r['ratio_median']:>6.1f} {r['share_of_kafka_time_at_default_intervals']:>15.1%}")
    write_json(args.out, {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
