"""`make bench`: the benchmarks in bench/, one after the other (each writes bench/results/<name>.json and
prints its table; docs/benchmarks.md explains the figures). A failing benchmark does not stop the others;
the exit code says whether all succeeded.

The scripts sit in folders that mirror the packages' (bench/spark/<folder>/, bench/operator/<folder>/: the
code each one measures); the shared modules (the broker, the report, /proc sampling) stay here. Every script
is named below, in `BENCHES` or in `BY_HAND` with why `make bench` leaves it out
(tests/unit/bench/test_bench_scripts.py holds the two to the files on disk).

    .venv/bin/python bench/run_all.py [--only throughput,freshness,...] [--quick]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: name → (script under bench/, full arguments, quick arguments)
BENCHES: dict[str, tuple[str, list[str], list[str]]] = {
    "throughput": ("spark/kafka/throughput.py", [], ["--records", "50000"]),
    "freshness": ("spark/kafka/freshness.py", [], ["--seconds", "30"]),
    "client_first_answer": ("spark/kafka/client_first_answer.py", [], ["--n", "4"]),
    "commit_latency": ("spark/iceberg/commit_latency.py", [], ["--batches", "100"]),
    "bigquery_append": ("spark/bigquery/bigquery_append.py", [], ["--records", "30000", "--naive-records", "10000"]),
    "retention_check": ("operator/retention/retention_check.py", [], ["--runs", "5"]),
    "replay": ("operator/replay/replay.py", [], ["--records", "100000"]),
    "decode_formats": ("spark/decode/decode_formats.py", [], ["--records", "20000"]),
    "operator_scale": ("operator/handoff/operator_scale.py", [], ["--counts", "10,50", "--steady", "60"]),
    "transform": ("spark/sink/transform.py", [], ["--records", "50000", "--passes", "1"]),
    "progress_poll": ("spark/driver/progress_poll.py", [], ["--polls", "50", "--rounds", "1"]),
    "query_hold": ("spark/driver/query_hold.py", [], ["--cycles", "1"]),
    "dedupe_window": ("spark/sink/dedupe_window.py", [], ["--records", "100000", "--batch", "10000"]),
}
#: script under bench/ → why `make bench` does not run it (run it by hand; docs/benchmarks.md has its section)
BY_HAND: dict[str, str] = {
    "operator/scaling/scaling_live.py": "runs the operator and drivers as pods on the test bed's real node "
                                        "(kubelet + containerd, as root), as tests/e2e does",
    "spark/startup/pod_restart.py": "runs the operator and drivers as pods on the test bed's real node "
                                    "(kubelet + containerd, as root), as tests/e2e does",
    "operator/scaling/scaling.py": "a model run of the scaling rule over a simulated plant, not a measurement",
    "spark/startup/cold_start.py": "not added to make bench when it was written",
    "spark/startup/jvm_cds.py": "not added to make bench when it was written",
    "spark/sink/dataframe_path.py": "a study of which DataFrame path to build (issue 31): ~40 minutes for its 1M "
                                    "records at two JIT settings; docs/design/spark-data-path.md",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated subset of " + ",".join(BENCHES))
    ap.add_argument("--quick", action="store_true", help="smaller runs (minutes, not tens of minutes)")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(BENCHES)
    failed = []
    for name in names:
        script, full, quick = BENCHES[name]
        if not (HERE / script).exists():
            print(f"== {name}: {script} not present, skipped", flush=True)
            continue
        print(f"\n== {name} ({script})", flush=True)
        t = time.monotonic()
        rc = subprocess.call([sys.executable, str(HERE / script), *(quick if args.quick else full)])
        print(f"== {name}: exit {rc} after {time.monotonic() - t:.0f} s", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
