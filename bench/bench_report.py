"""How a benchmark reports: its JSON document (with the machine's facts, so a number is never read without
the load it was measured under) and its table of results, one row per pipeline. Shared so every script
states the same facts in the same words, as `bench_kafka.py` is shared for the broker."""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

RESULTS = Path(__file__).resolve().parent / "results"

# A table column: its heading, its width, and the cell text of one result.
Column = tuple[str, int, Callable[[Mapping[str, Any]], Any]]


def add_out_argument(parser: Any, name: str) -> None:
    parser.add_argument("--out", default=str(RESULTS / name), help="where the JSON goes")


def machine_facts() -> dict[str, Any]:
    """CPUs, load average, Python and the time of the run, for the JSON document."""
    return {"cpus": os.cpu_count(), "load_avg": os.getloadavg(), "python": platform.python_version(),
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_json(out: str | Path, doc: Any) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")


def add_rates(results: Mapping[str, dict[str, Any]]) -> None:
    """rows/s (and MB/s where the result counts bytes) of every result that moved rows."""
    for r in results.values():
        if "rows" in r and r["seconds"]:
            r["rows_per_s"] = r["rows"] / r["seconds"]
            if "bytes" in r:
                r["mb_per_s"] = r["bytes"] / r["seconds"] / 1e6


def one_decimal(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}"


def print_results(results: Mapping[str, Mapping[str, Any]], columns: Sequence[Column], out: str | Path) -> None:
    """The table (a result without rows — a pipeline that only timed something — shows its seconds only),
    then the load average the run ended under and where the JSON went. `columns` after the first two
    (`rows`, `seconds`) are the script's own."""
    print(f"\n{'pipeline':<24}" + "".join(f" {heading:>{width}}" for heading, width, _ in columns))
    for name, r in results.items():
        shown = columns if "rows" in r else [(h, w, (lambda _r: "") if h == "rows" else cell)
                                             for h, w, cell in columns[:2]]
        print(f"{name:<24}" + "".join(f" {cell(r):>{width}}" for _, width, cell in shown))
    print(f"\nload average during the run: {os.getloadavg()} on {os.cpu_count()} CPUs; wrote {out}")
