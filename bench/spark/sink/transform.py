"""Does Spark carrying the records pay (issue 31)? Handoff's own DataFrame path against its baselines, in one run.

The questions, each a ratio of rates measured in the same run (`dataframe_path.py` does the measuring: same topic,
same Iceberg sink, AvailableNow from the topic's start, best of the passes; its JSON is kept beside this one):
- `sql+dedupe / raw`: Handoff with a projection + filter (`dataframe_path.SQL`) + a dedupe on the order id and
  event time (`product-sql-dedupe`, what `driver.app.start_query` runs for such a spec), against one
  confluent-kafka consumer counting the records (the ceiling). The issue's target: ≥ 0.5.
- `sql+dedupe / JVM`: the same against Spark's JVM Kafka source + `from_json` + the same SQL and dedupe into the
  same sink (`jvm-fromjson-sql-dedupe-iceberg`). Target: ≥ 2.
- `frame / fused`: the DataFrame path without a transform's cost (`product-frame`: `SELECT * FROM source`)
  against today's fused path (`fused`) — each under the JIT setting Handoff gives it (C2 on the DataFrame path,
  C1 on the fused one). Within 15 %, the fused path could go; otherwise it stays the planner's choice when no
  transform, dedupe or event time is set (it does).

    .venv/bin/python bench/spark/sink/transform.py [--records 1000000] [--passes 2]

Prints a table and writes bench/results/transform.json (and transform_parts.json, dataframe_path's own).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from bench_kafka import add_broker_argument  # noqa: E402
from bench_report import add_out_argument, machine_facts, write_json  # noqa: E402

CANDIDATES = "fused,product-frame,product-sql-dedupe,jvm-fromjson-sql-dedupe-iceberg"
#: (name, numerator, denominator, target): rates of `dataframe_path` results, `candidate [jit]`.
RATIOS = (("sql+dedupe / raw", "product-sql-dedupe [c2]", "raw-consume", 0.5),
          ("sql+dedupe / JVM", "product-sql-dedupe [c2]", "jvm-fromjson-sql-dedupe-iceberg [c2]", 2.0),
          ("frame / fused", "product-frame [c2]", "fused [c1]", 0.85))


def rate(results: dict[str, Any], name: str) -> float | None:
    r = results.get(name) or {}
    n = r.get("records") or r.get("rows")
    return n / r["seconds"] if n and r.get("seconds") else None


def ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for label, num, den, target in RATIOS:
        a, b = rate(results, num), rate(results, den)
        value = a / b if a and b else None
        out.append({"ratio": label, "numerator": num, "denominator": den, "value": value, "target": target,
                    "met": value is not None and value >= target,
                    "check": (results.get(num) or {}).get("check")})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--passes", type=int, default=2)
    add_broker_argument(ap)
    add_out_argument(ap, "transform.json")
    args = ap.parse_args(argv)
    parts = str(Path(args.out).with_name("transform_parts.json"))
    cmd = [sys.executable, str(HERE / "dataframe_path.py"), "--records", str(args.records), "--passes",
           str(args.passes), "--candidates", CANDIDATES, "--jit", "c1,c2", "--out", parts]
    if args.bootstrap:
        cmd += ["--bootstrap", args.bootstrap]
    done = subprocess.run(cmd)
    if done.returncode != 0:
        print(f"dataframe_path.py exited {done.returncode}", file=sys.stderr)
        return done.returncode
    results = json.loads(Path(parts).read_text())["results"]
    table = ratios(results)
    write_json(args.out, {"records": args.records, "passes": args.passes, **machine_facts(), "ratios": table,
                          "rates": {name: rate(results, name) for name in results}, "parts": parts})
    print(f"\n{'ratio':<20} {'value':>7} {'target':>7}  met  (rows check of the numerator)")
    for row in table:
        value = f"{row['value']:.2f}" if row["value"] is not None else "-"
        print(f"{row['ratio']:<20} {value:>7} {row['target']:>7.2f}  {'yes' if row['met'] else 'no ':<3}  "
              f"{row['check'] or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
