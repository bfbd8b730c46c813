"""A driver pod's restart → its first commit, with and without the fork server, MEASURED on the test bed's real node
(kubelet + containerd): the operator runs from the chart, the driver from the project's image, a real executor pod
registers, records go into an Iceberg table (PostgreSQL catalog, S3 on moto).

The question: `bench/spark/startup/cold_start.py` measures a local-master driver. In a driver pod the fork server
(`startup.fork_server`, through the image's launcher) forks only the driver's own Python processes (the planners,
the source and commit runners); the executor pod starts its JVM and its worker daemon as before. How much of a pod's
restart does it take off?

Per configuration, in one run on the same cluster, one after the other: `forkserver` (the image as shipped) and
`noforkserver` (the driver pod's `HANDOFF_FORK_SERVER=0`, through `spec.spark.driver.pod.env`). Each gets its own
namespace, operator, topic and table; 3,000 records wait, the first driver commits them; then `--restarts` times:
3,000 more records, the driver pod deleted with no grace (as a node loss would), and from the new driver pod's log
(`kubectl logs --timestamps`): its container's start → its Spark session ("spark session started"), → its query's
first commit ("batch N: …", Spark's); and Spark's own durations of that first batch. Also the deletion → the first
commit, which includes the pod's scheduling and the container's start. At the end the table is checked (rows ==
distinct offsets == produced).

What it is not: a capacity figure. Kafka, PostgreSQL, moto, the API server, the operator, the driver and the
executor share this machine's 2 CPUs; the two configurations run under the same conditions minutes apart.

    .venv/bin/python bench/spark/startup/pod_restart.py [--restarts 3] [--configs forkserver,noforkserver] [--out …]

Runs and findings: docs/benchmarks.md, "A driver pod's restart".
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "tests" / "e2e"), str(ROOT / "hack"), str(ROOT / "operator"), str(ROOT / "spark_app"),
                str(ROOT / "bench" / "operator" / "scaling")]

from iceberg_drill_support import produce  # noqa: E402
from in_cluster_support import (Cluster, eventually, install_operator, lake_catalog, lake_handoff, pods,  # noqa: E402
                                provide_checkpoint_volume, remove, running)
from scaling_live import each_on_node  # noqa: E402

NAME = "restart"
DRIVER = f"handoff.io/name={NAME},app.kubernetes.io/component=driver"
#: The driver pod's extra environment per configuration.
CONFIGS: dict[str, dict[str, str]] = {"forkserver": {}, "noforkserver": {"HANDOFF_FORK_SERVER": "0"}}
BATCH = 3000
LINE_TS = re.compile(r"^(\S+) ")


def _ts(stamp: str) -> float:
    """A `kubectl logs --timestamps` or Kubernetes time (RFC 3339, nanoseconds) as epoch seconds."""
    stamp = stamp.rstrip("Z")
    whole, _, frac = stamp.partition(".")
    return _dt.datetime.fromisoformat(whole).replace(tzinfo=_dt.timezone.utc).timestamp() + float(f"0.{frac or 0}")


def _driver(cluster: Cluster, ns: str, not_named: str | None = None) -> dict[str, Any] | None:
    found = [p for p in pods(cluster, ns, DRIVER) if running(p) and p["metadata"]["name"] != not_named]
    return found[0] if len(found) == 1 else None


def life(cluster: Cluster, ns: str, pod: dict[str, Any], deleted_at: float | None) -> dict[str, Any]:
    """The figures of one driver pod's start, from its log (once its first Spark commit is in it)."""
    name = pod["metadata"]["name"]

    def first_commit() -> tuple[list[str], str] | None:
        lines = cluster.kubectl("logs", "--timestamps", "-n", ns, name, check=False).splitlines()
        commit = next((line for line in lines if re.search(r" batch \d+: \d+ rows", line)), None)
        return (lines, commit) if commit else None

    lines, commit = eventually(first_commit, f"{name}'s first commit", timeout=600, interval=1)
    pod = cluster.get("pod", name, "-n", ns)
    started = _ts(pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])
    session = next((line for line in lines if "spark session started" in line), None)
    durations = next((line for line in lines if "first batch" in line and "durations" in line), None)
    at = {"session": _ts(LINE_TS.match(session).group(1)) if session else None,
          "commit": _ts(LINE_TS.match(commit).group(1))}
    return {"pod": name,
            "start_to_session_s": round(at["session"] - started, 2) if at["session"] else None,
            "start_to_first_commit_s": round(at["commit"] - started, 2),
            "deleted_to_first_commit_s": round(at["commit"] - deleted_at, 2) if deleted_at else None,
            "first_batch": commit.split(" ", 1)[1][:200],
            "first_batch_durations": json.loads(durations.split("durations (ms) ", 1)[1]) if durations else None}


def run_config(cluster: Cluster, kafka: Any, postgres: Any, s3: Any, label: str, restarts: int) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:5]
    ns, topic, bucket, system = f"restart-{label}-{suffix}", f"restart-{suffix}", f"restart-{suffix}", \
        f"handoff-system-{suffix}"
    cluster.kubectl("create", "namespace", ns)
    install_operator(cluster, system, ns, {"statusInterval": 3, "deleteGraceSeconds": 60})
    kafka.create_topic(topic, partitions=3)
    pv = provide_checkpoint_volume(cluster, ns, f"{NAME}-checkpoint")
    catalog = lake_catalog(postgres, s3, bucket)
    table = f"bench.r{suffix}"
    handoff = lake_handoff(cluster, ns, NAME, bootstrap=kafka.pod_bootstrap, topic=topic, postgres=postgres, s3=s3,
                           bucket=bucket, table=table, scaling={"minExecutors": 1, "maxExecutors": 1},
                           executor_memory="1Gi", spark_conf={"spark.kubernetes.executor.request.cores": "250m"})
    env = [{"name": k, "value": v} for k, v in CONFIGS[label].items()]
    if env:
        handoff["spec"]["spark"]["driver"]["pod"] = {"env": env}
    produced = produce(kafka.bootstrap, topic, range(0, BATCH))
    lives: list[dict[str, Any]] = []

    def rows() -> int:
        try:
            return catalog.load_table(table).scan(selected_fields=("_kafka_offset",)).to_arrow().num_rows
        except Exception:  # noqa: BLE001 - not made yet
            return 0

    try:
        cluster.apply(handoff)
        eventually(lambda: rows() >= produced, "the first records", timeout=900, interval=2)
        pod = eventually(lambda: _driver(cluster, ns), "the driver pod")
        lives.append({"life": 0, **life(cluster, ns, pod, None)})
        for n in range(1, restarts + 1):
            produced += produce(kafka.bootstrap, topic, range(n * BATCH, (n + 1) * BATCH))
            old = pod["metadata"]["name"]
            deleted_at = time.time()
            cluster.kubectl("delete", "pod", "-n", ns, old, "--grace-period=0", "--force")
            pod = eventually(lambda: _driver(cluster, ns, not_named=old), "a new driver pod", timeout=300)
            lives.append({"life": n, **life(cluster, ns, pod, deleted_at)})
            eventually(lambda: rows() >= produced, f"life {n}'s records", timeout=900, interval=2)
            print(f"{label} life {n}: {lives[-1]}", flush=True)
        data = catalog.load_table(table).scan(selected_fields=("_kafka_partition", "_kafka_offset")).to_arrow()
        distinct = len(set(zip(data["_kafka_partition"].to_pylist(), data["_kafka_offset"].to_pylist())))
        check = {"rows": data.num_rows, "distinct_offsets": distinct, "produced": produced,
                 "ok": data.num_rows == distinct == produced}
    finally:
        remove(cluster, ns, system, pv=pv)
    return {"config": label, "driver_env": CONFIGS[label], "lives": lives, "table": check}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--restarts", type=int, default=3, help="driver pods deleted per configuration")
    parser.add_argument("--configs", default="forkserver,noforkserver", help="which of " + ", ".join(CONFIGS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/pod_restart.json")
    args = parser.parse_args()
    workdir = ROOT / ".test-logs" / f"bench-pod-restart-{os.getpid()}"
    load_before = os.getloadavg()
    results = each_on_node(workdir, args.configs.split(","),
                           lambda cluster, kafka, postgres, s3, label: run_config(cluster, kafka, postgres, s3, label,
                                                                                   args.restarts))
    report = {"bench": "pod_restart", "kind": "measured on the test bed's real node (shared 2 CPUs)",
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "load_before": [round(x, 2) for x in load_before],
                          "load_after": [round(x, 2) for x in os.getloadavg()]},
              "params": {"records_per_life": BATCH, "restarts": args.restarts, "driver_cores": 1,
                         "executor_request_cores": "250m", "commit_interval": "2s"},
              "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("\n| config | life | start → session s | start → first commit s | deleted → first commit s | "
          "first batch ms | table |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        for lf in r["lives"]:
            ms = (lf["first_batch_durations"] or {}).get("triggerExecution")
            print(f"| {r['config']} | {lf['life']} | {lf['start_to_session_s']} | {lf['start_to_first_commit_s']} | "
                  f"{lf['deleted_to_first_commit_s']} | {ms} | {'ok' if r['table']['ok'] else r['table']} |")
    print(f"\nload average before {load_before}, after {os.getloadavg()}; JSON: {args.out}")


if __name__ == "__main__":
    main()
