"""Decode rate of the Schema Registry formats beside the JSON path, in the same run, on the same records.

  * `json` (baseline) — `decode.decode_batch` on JSON values (the C++ `read_json` fast path);
  * `avro-direct` — `registry_decode.decode_registry_batch` (what the sinks run): fastavro's `schemaless_reader`
    on the writer schema cached by id, then Arrow columns;
  * `avro-confluent` — confluent-kafka's own `AvroDeserializer` per record, then `pa.Table.from_pylist`
    (the alternative the decoder was measured against);
  * `jsonSchema-direct` — `decode_registry_batch` on JSON Schema values (json.loads + validation).

Same 6-field record (long, string, double, boolean, timestamp, nullable string) for every format; the values are
produced by confluent-kafka's serializers against the test bed's real Schema Registry (Apicurio), started here.
Rows/s is the median of `--runs` passes over `--records` records. Prints a table, writes
bench/results/decode_formats.json.

    .venv/bin/python bench/spark/decode/decode_formats.py [--records 50000] [--runs 5] [--registry URL]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "spark_app"))
sys.path.insert(0, str(ROOT / "hack"))

import pyarrow as pa  # noqa: E402

AVRO = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"}, {"name": "price", "type": "double"},
    {"name": "paid", "type": "boolean"},
    {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "note", "type": ["null", "string"], "default": None}]}
JSON_SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer"}, "item": {"type": "string"}, "price": {"type": "number"}, "paid": {"type": "boolean"},
    "placed": {"type": "string", "format": "date-time"}, "note": {"type": ["string", "null"]}}}
COLUMNS = [("id", "long"), ("item", "string"), ("price", "double"), ("paid", "boolean"), ("placed", "timestamp"),
           ("note", "string")]


def _raw(values: list[bytes]) -> pa.Table:
    n = len(values)
    return pa.table({"key": pa.nulls(n, pa.binary()), "value": pa.array(values, pa.binary()),
                     "topic": pa.array(["bench"] * n), "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array(range(n), pa.int64()),
                     "timestamp": pa.nulls(n, pa.timestamp("us", tz="UTC"))})


def _median_rate(fn: Callable[[], Any], rows: int, runs: int) -> float:
    fn()  # warm: schema fetch, imports
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return rows / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--registry", help="use this running registry's Confluent API URL instead of starting one")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "decode_formats.json"))
    args = ap.parse_args(argv)

    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from handoff_spark.config import Column, SchemaPolicy, SchemaRegistry
    from handoff_spark.decode.records import decode_batch
    from handoff_spark.decode.registry import decode_registry_batch
    from handoff_testbed.schema_registry import SchemaRegistry as Registry

    registry = Registry()
    if not args.registry:
        registry.build()
        registry.start(Path(tempfile.mkdtemp(prefix="bench-registry-")))
    url = args.registry or registry.url
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        client = SchemaRegistryClient({"url": url})
        ctx = SerializationContext("bench", MessageField.VALUE)
        now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
        docs = [{"id": i, "item": f"sku-{i % 1000}", "price": i * 0.25, "paid": i % 2 == 0, "placed": now,
                 "note": None if i % 3 else f"n{i}"} for i in range(args.records)]
        avro_ser = AvroSerializer(client, json.dumps(AVRO))
        avro_values = [avro_ser(d, ctx) for d in docs]
        json_docs = [{**d, "placed": now.isoformat()} for d in docs]
        js_ser = JSONSerializer(json.dumps(JSON_SCHEMA), client)
        js_values = [js_ser(d, SerializationContext("bench-js", MessageField.VALUE)) for d in json_docs]
        plain_json = [json.dumps(d, separators=(",", ":")).encode() for d in json_docs]
        policy = SchemaPolicy(columns=[Column(name=n, type=t) for n, t in COLUMNS], evolution="none",
                              on_incompatible="deadLetter")
        reg = SchemaRegistry(url=url)
        raw_avro, raw_js, raw_json = _raw(avro_values), _raw(js_values), _raw(plain_json)
        deser = AvroDeserializer(client)

        def confluent() -> pa.Table:
            return pa.Table.from_pylist([deser(v, ctx) for v in avro_values])

        checks = {"json": decode_batch(raw_json, policy)[0].num_rows,
                  "avro-direct": decode_registry_batch(raw_avro, policy, "avro", reg)[0].num_rows,
                  "jsonSchema-direct": decode_registry_batch(raw_js, policy, "jsonSchema", reg)[0].num_rows}
        assert all(n == args.records for n in checks.values()), checks
        load = os.getloadavg()[0]
        rates = {
            "json": _median_rate(lambda: decode_batch(raw_json, policy), args.records, args.runs),
            "avro-direct": _median_rate(lambda: decode_registry_batch(raw_avro, policy, "avro", reg),
                                        args.records, args.runs),
            "avro-confluent": _median_rate(confluent, args.records, args.runs),
            "jsonSchema-direct": _median_rate(lambda: decode_registry_batch(raw_js, policy, "jsonSchema", reg),
                                              args.records, args.runs),
        }
    finally:
        registry.stop()
    print(f"{'path':<20}{'rows/s':>12}{'× json':>9}   (load {load:.1f}, {args.records} records, median of {args.runs})")
    for name, rate in rates.items():
        print(f"{name:<20}{rate:>12,.0f}{rate / rates['json']:>9.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_1m": load,
        "records": args.records, "runs": args.runs, "rows_per_s": rates}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
