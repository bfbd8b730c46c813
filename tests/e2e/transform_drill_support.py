"""What the transform drills share, whatever the sink (tests/e2e/test_transform.py for Iceberg,
tests/e2e/test_bigquery_transform.py for BigQuery): the orders, the SQL over them, the producer and the
dead-letter reader."""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

from confluent_kafka import Consumer, Producer

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
COLUMNS = [{"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamp"},
           {"name": "customer", "type": "string"}, {"name": "amount", "type": "double"},
           {"name": "region", "type": "string"}]
SQL = ("SELECT id, ts, upper(customer) AS customer, CAST(round(amount * 1.1, 2) AS DOUBLE) AS amount, region, "
       "_kafka_topic, _kafka_partition, _kafka_offset, _kafka_timestamp FROM source WHERE amount >= 5")

#: Under ANSI SQL (Spark's default) the cast fails on a customer that is not c<digits>: the task, so the batch fails.
POISON_SQL = SQL.replace("WHERE amount >= 5", "WHERE CAST(substr(customer, 2) AS INT) >= 0 AND amount >= 5")
POISON_IDS = frozenset({77, 305, 306})  # amounts 17, 5, 6: the amount filter keeps them, so the cast must run


def poisoned_orders(n: int) -> list[dict[str, Any]]:
    """`n` orders, those of POISON_IDS with a customer POISON_SQL's cast fails on ('cX')."""
    return [{**order(i, i), "customer": "cX"} if i in POISON_IDS else order(i, i) for i in range(n)]


def order(i: int, minutes: float) -> dict[str, Any]:
    return {"id": i, "ts": (T0 + dt.timedelta(minutes=minutes)).isoformat(), "customer": f"c{i % 7}",
            "amount": float(i % 20), "region": ["eu", "us", "ap"][i % 3]}


def produce(bootstrap: str, topic: str, orders: list[dict[str, Any]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for o in orders:
        p.produce(topic, key=str(o["id"]).encode(), value=json.dumps(o).encode())
    assert p.flush(30) == 0


def dead_letters(bootstrap: str, topic: str) -> list[tuple[dict[str, Any], str]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{topic}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    out, idle = [], 0
    try:
        while idle < 6:
            m = c.poll(0.5)
            if m is None:
                idle += 1
                continue
            if m.error():
                continue
            idle = 0
            headers = {k: (v.decode() if v else v) for k, v in (m.headers() or [])}
            out.append((json.loads(m.value()), headers.get("handoff.reason") or headers.get("reason") or ""))
    finally:
        c.close()
    return out


def first_phase(n: int) -> list[dict[str, Any]]:
    """n orders a minute apart, and every 10th re-sent 5 minutes later (a business-key duplicate)."""
    orders = [order(i, i) for i in range(n)]
    dups = [order(i, i + 5) for i in range(0, n, 10)]
    out: list[dict[str, Any]] = []
    for o in orders:
        out.append(o)
        if o["id"] % 10 == 0 and o["id"] >= 10:
            out.append(dups[o["id"] // 10 - 1])
    return out
