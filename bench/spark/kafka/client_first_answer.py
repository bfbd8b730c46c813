"""How long a new Kafka client of the data plane waits for its first answer, and what keeping one saves.

The question (session 49, issue 31): a batch's consumer-group commit made a new consumer each time, and every Python
worker's first range reader and every query's broker queries make a new client. librdkafka's `debug=broker` log
showed each waiting "still suppressed for 49ms" before it connected to a broker after dropping its bootstrap
connection: half of `reconnect.backoff.ms`. Measured against a test-bed broker on loopback, in one run, each `--n`
times in a fresh process per configuration (the process's first client pays librdkafka's own start, reported
apart):
  * a consumer-group commit through `kafka.offsets.commit_group_offsets`' settings with a new consumer each time,
    with librdkafka's backoff (100, the baseline) and Handoff's (`kafka.client_defaults`, 10);
  * the same commits through one consumer kept in the process (what `commit_group_offsets` does now);
  * a new range reader's first metadata answer (`kafka.source.reader_conf`), both backoffs.
Prints a table (median and max ms) and writes bench/results/client_first_answer.json.

    .venv/bin/python bench/spark/kafka/client_first_answer.py [--n 8] [--bootstrap HOST:PORT]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "spark_app"))
sys.path.insert(0, str(ROOT / "hack"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_kafka import add_broker_argument, broker  # noqa: E402
from bench_report import add_out_argument, machine_facts, write_json  # noqa: E402

TOPIC, GROUP = "bench-client-first-answer", "bench-client-first-answer"
#: librdkafka's own default, the baseline.
LIBRDKAFKA_BACKOFF = {"reconnect.backoff.ms": "100"}


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 1)


def measure(bootstrap: str, case: str, n: int, out: Any) -> None:
    """In a fresh process: `n` timings of `case` (the first one apart: the process's first librdkafka client)."""
    from confluent_kafka import Consumer, TopicPartition

    from handoff_spark.kafka.offsets import group_client_conf
    from handoff_spark.kafka.source import SourceOptions, reader_conf

    baseline = case.endswith("librdkafka's backoff")
    props = dict(LIBRDKAFKA_BACKOFF) if baseline else {}
    times = []
    if case.startswith("group commit"):
        conf = group_client_conf(bootstrap, GROUP, props, {"socket.timeout.ms": 10_000})
        kept = Consumer(conf) if "kept" in case else None
        for i in range(n + 1):
            tps = [TopicPartition(TOPIC, 0, i + 1)]
            t = time.perf_counter()
            if kept is not None:
                kept.commit(offsets=tps, asynchronous=False)
            else:
                c = Consumer(conf)
                c.commit(offsets=tps, asynchronous=False)
                c.close()
            times.append(_ms(t))
        if kept is not None:
            kept.close()
    else:
        conf = reader_conf(SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": TOPIC,
                                                **{f"kafka.{k}": v for k, v in props.items()}}))
        for _ in range(n + 1):
            t = time.perf_counter()
            c = Consumer(dict(conf))
            c.list_topics(TOPIC, timeout=10)
            times.append(_ms(t))
            c.close()
    out.put({"case": case, "reconnect_backoff_ms": int(conf["reconnect.backoff.ms"]), "first_ms": times[0],
             "ms": times[1:]})


CASES = ["group commit, new consumer, librdkafka's backoff", "group commit, new consumer, Handoff's",
         "group commit, kept consumer, Handoff's", "reader's first metadata, librdkafka's backoff",
         "reader's first metadata, Handoff's"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=8, help="timings per case (after its process's first client)")
    add_broker_argument(ap)
    add_out_argument(ap, "client_first_answer.json")
    args = ap.parse_args()
    results = []
    with broker(args.bootstrap) as (bootstrap, _kafka):
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})  # kept while its future is pending
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result()
        ctx = multiprocessing.get_context("spawn")
        for case in CASES:
            q = ctx.Queue()
            p = ctx.Process(target=measure, args=(bootstrap, case, args.n, q))
            p.start()
            results.append(q.get(timeout=300))
            p.join(60)
    print(f"\n| case | first client of its process | median | max |\n|---|---:|---:|---:|")
    for r in results:
        print(f"| {r['case']} | {r['first_ms']} ms | {statistics.median(r['ms'])} ms | {max(r['ms'])} ms |")
    write_json(args.out, {"n": args.n, **machine_facts(), "results": results})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
