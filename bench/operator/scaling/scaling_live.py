"""Scaling on lag vs fixed executor counts, MEASURED on the test bed's real node (kubelet + containerd): the
operator runs as a pod from the chart, the driver from the project's image, executor pods really run and
register with the driver, records go into an Iceberg table (PostgreSQL catalog, S3 on moto).

One run, three configurations one after the other on the same cluster (same broker, same table backend):
`scaling` (minExecutors 1, maxExecutors 3: the operator decides), `fixed-min` (1..1) and `fixed-max` (3..3).
Each gets its own topic and namespace. A producer writes `--base` records/s for `--before` seconds, then 4×
that for `--high` seconds, then `--base` again until the lag is drained (at most `--drain-limit` s).

Reported per configuration, from the step up (t = 0):
- decision: seconds until `status.executors.desired` first rose (scaling only; as this bench's 1 s polling saw
  it, and by the status's `lastScaleTime`, whole seconds), and its message (the lag, input
  rate and rate per executor it decided on); every sample keeps `status.executors.reason`, and its message when
  it changed, so a late decision can be explained from the JSON;
- registered: seconds until the driver had that many executors registered (Spark's REST API on the driver);
- lag peak: the highest `status.lag` (the operator's Kafka end offsets − the table's ledger, every 3 s);
- drain: seconds from the step back down until `status.lag` is at most one steady batch (base × 2 s);
- executor-seconds: registered executors integrated over the same window in every configuration, from the step
  up to `--horizon` seconds after the step down (what each policy costs for the same episode; until 2026-11-26
  the window ended at each configuration's own drain, and for the scaling rows only once the count was back at
  the minimum, so fixed-max's cost stopped early and the rows were not comparable);
- restarts: the driver pod's container restarts + driver pods replaced (must be 0);
- warm: seconds until the driver's warm-up job had run on every executor added after the step (the
  `executors … warm` lines of its log; `scaling-nowarm` turns the warm-up off).

Each executor pod gets a CPU limit (`--executor-cpu-limit`, default 400m): without one, an executor on this
2-CPU node takes whatever CPU is free, one executor already uses most of it, and adding executors adds no
capacity (the first runs showed exactly that); with it each executor adds its share, as on a real cluster
where executors land on their own cores.

What it is not: a capacity benchmark. All of it — Kafka, PostgreSQL, moto, the API server, the operator,
the driver and every executor — shares this machine's 2 CPUs (and other sessions' load: the load average is
recorded), so more executors add parallel tasks but little CPU; the figures compare the three policies under
the same conditions in the same run, nothing more.

    nice -n 10 .venv/bin/python bench/operator/scaling/scaling_live.py [--base 1500] [--before 20] [--high 60]
        [--executor-cpu-request 200m] [--executor-cpu-limit 400m] [--configs scaling,fixed-min,fixed-max[,scaling-nospec]] [--out ...]

Runs and findings: docs/benchmarks.md, "Scaling on lag vs fixed executors".
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "tests" / "e2e"), str(ROOT / "hack"), str(ROOT / "operator"), str(ROOT / "spark_app")]

from confluent_kafka import Producer  # noqa: E402
from handoff_operator.spec.render import STRAGGLER_CONF  # noqa: E402

from in_cluster_support import (Cluster, install_operator, kafka_for_pods, lake_handoff, pod_proxy_json,  # noqa: E402
                                pods, provide_checkpoint_volume, remove, running, testbed_cluster)

NAME = "bench"
CONFIGS = {"scaling": (1, 3), "fixed-min": (1, 1), "fixed-max": (3, 3), "scaling-nospec": (1, 3),
           "scaling-nowarm": (1, 3)}
#: Spark settings a configuration adds to the handoff's: `scaling-nospec` is `scaling` without the operator's
#: speculative copies of straggler tasks (render.STRAGGLER_CONF), `scaling-nowarm` without the warm-up of new
#: executors (executor_warmup), each to show what it changes in the same run.
EXTRA_CONF = {"scaling-nospec": {"spark.speculation": "false"},
              "scaling-nowarm": {"spark.handoff.executorWarmup": "false"}}
DEFAULT_CONFIGS = "scaling,fixed-min,fixed-max"
DRIVER = f"handoff.io/name={NAME},app.kubernetes.io/component=driver"


def paced_producer(bootstrap: str, topic: str, rate_at: Any, stop: threading.Event, counter: list[int]) -> None:
    """Writes rate_at(now) records/s in 0.1 s slices until `stop`."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    owed, last = 0.0, time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        owed += rate_at(now) * (now - last)
        last = now
        for _ in range(int(owed)):
            i = counter[0]
            producer.produce(topic, key=str(i).encode(),
                             value=json.dumps({"id": i, "ts": "2026-01-01T00:00:00Z", "region": "eu"}).encode())
            counter[0] += 1
            producer.poll(0)
        owed -= int(owed)
        time.sleep(0.1)
    producer.flush(30)


def sample(cluster: Cluster, ns: str, app: dict[str, str]) -> dict[str, Any]:
    handoff = cluster.get("streamtablehandoff", NAME, "-n", ns)
    status = handoff.get("status") or {}
    drivers = [p for p in pods(cluster, ns, DRIVER) if running(p)]
    registered = None
    if len(drivers) == 1:
        name = drivers[0]["metadata"]["name"]
        try:
            if app.get("driver") != name:
                (app["id"],) = [a["id"] for a in pod_proxy_json(cluster, ns, name, 4040, "/api/v1/applications")]
                app["driver"] = name
            listed = pod_proxy_json(cluster, ns, name, 4040, f"/api/v1/applications/{app['id']}/executors")
            registered = sum(1 for e in listed if e["id"] != "driver")
        except (AssertionError, ValueError):
            registered = None
    executors = status.get("executors") or {}
    return {"t": time.monotonic(), "desired": executors.get("desired"),
            "reason": executors.get("reason"), "message": executors.get("message"),
            "last_scale": executors.get("lastScaleTime"),
            "lag": status.get("lag"), "registered": registered,
            "drivers": [(p["metadata"]["uid"], sum(c.get("restartCount", 0)
                                                   for c in p["status"].get("containerStatuses", [])))
                        for p in drivers]}


def run_config(cluster: Cluster, kafka: Any, postgres: Any, s3: Any, label: str, bounds: tuple[int, int],
               args: argparse.Namespace) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:5]
    ns, topic, bucket = f"bench-{label}-{suffix}", f"bench-{suffix}", f"bench-{suffix}"
    system = f"handoff-system-{suffix}"
    cluster.kubectl("create", "namespace", ns)
    install_operator(cluster, system, ns, {"statusInterval": 3, "deleteGraceSeconds": 60})
    s3.create_bucket(bucket)
    kafka.create_topic(topic, partitions=3)
    pv = provide_checkpoint_volume(cluster, ns, f"{NAME}-checkpoint")
    lo, hi = bounds
    handoff = lake_handoff(cluster, ns, NAME, bootstrap=kafka.pod_bootstrap, topic=topic, postgres=postgres, s3=s3,
                           bucket=bucket, table=f"bench.t{suffix}",
                           scaling={"minExecutors": lo, "maxExecutors": hi, "targetCatchUp": "20s",
                                    "cooldown": "15s"},
                           source={"maxRecordsPerBatch": args.max_records_per_batch},
                           spark_conf={"spark.kubernetes.executor.request.cores": args.executor_cpu_request,
                                       **({"spark.kubernetes.executor.limit.cores": args.executor_cpu_limit}
                                          if args.executor_cpu_limit else {}),
                                       **dict(kv.split("=", 1) for kv in args.spark_conf),
                                       **EXTRA_CONF.get(label, {})})
    stop, counter = threading.Event(), [0]
    phase = {"step_up": None, "step_down": None}

    def rate_at(now: float) -> float:
        up, down = phase["step_up"], phase["step_down"]
        return args.base * 4 if up is not None and now >= up and (down is None or now < down) else args.base

    cluster.apply(handoff)
    app: dict[str, str] = {}
    samples: list[dict[str, Any]] = []
    producer = threading.Thread(target=paced_producer, args=(kafka.bootstrap, topic, rate_at, stop, counter))
    producer.start()
    try:
        # Ready: the driver runs its registered executors, has drained the base load once, and the operator
        # wants the minimum (a driver's start-up backlog can scale it up first, and the step must find it back at
        # the minimum: the sixteenth run's step found 2 executors asked for 30 s before it).
        deadline = time.monotonic() + args.start_limit
        while time.monotonic() < deadline:
            s = sample(cluster, ns, app)
            if (s["registered"] == lo and s["desired"] == lo and s["lag"] is not None
                    and s["lag"] <= args.base * 2):
                break
            time.sleep(2)
        else:
            raise SystemExit(f"{label}: never {lo} registered executor(s) with the base load drained within "
                             f"{args.start_limit}s (last sample: {s}; status.executors: "
                             f"{(cluster.get('streamtablehandoff', NAME, '-n', ns).get('status') or {}).get('executors')})")
        time.sleep(args.before)
        phase["step_up"], phase["step_up_wall"] = time.monotonic(), time.time()
        phase["step_down"] = phase["step_up"] + args.high
        end = phase["step_down"] + max(args.drain_limit, args.horizon)
        while time.monotonic() < end:
            s = sample(cluster, ns, app)
            samples.append(s)
            if (s["t"] > phase["step_down"] + args.horizon and s["lag"] is not None and s["lag"] <= args.base * 2
                    and (not label.startswith("scaling") or s["desired"] == lo)):
                break
            time.sleep(1)
        warmups = warm_ups(cluster, ns, phase["step_up_wall"])
    finally:
        save_driver_logs(cluster, ns, Path(args.logs) / label)
        stop.set()
        producer.join()
        # This configuration's operator goes too: the next one must not share the node with it.
        remove(cluster, ns, system, pv=pv)
    return {**summarize(label, samples, phase, lo, args), "warm_ups": warmups}


def save_driver_logs(cluster: Cluster, ns: str, into: Path) -> None:
    """The driver containers' logs (the current one and, after a restart, the previous one) before the
    namespace goes: a restart in a run must be explainable afterwards."""
    into.mkdir(parents=True, exist_ok=True)
    for p in pods(cluster, ns, DRIVER):
        name = p["metadata"]["name"]
        for which, extra in (("current", ()), ("previous", ("--previous",))):
            with contextlib.suppress(Exception):
                (into / f"{name}.{which}.log").write_text(cluster.kubectl("logs", "--timestamps", *extra, "-n", ns,
                                                                          name))


def warm_ups(cluster: Cluster, ns: str, step_wall: float) -> list[dict[str, Any]]:
    """The driver's warm-ups of new executors ("executors 2, 3 warm (4.1 s warm-up)"), with the time since
    the step of the line (the kubelet's timestamp)."""
    import datetime as dt
    import re

    out = []
    for p in pods(cluster, ns, DRIVER):
        log = cluster.kubectl("logs", "--timestamps", "-n", ns, p["metadata"]["name"])
        for stamp, ids, seconds in re.findall(r"^(\S+) .*?executors ([\d, ]+) warm \(([\d.]+) s warm-up\)", log,
                                              re.M):
            whole, _, fraction = stamp.rstrip("Z").partition(".")  # the kubelet writes nanoseconds
            at = dt.datetime.fromisoformat(f"{whole}.{(fraction or '0')[:6]}+00:00").timestamp()
            out.append({"executors": ids.split(", "), "warm_up_s": float(seconds), "t": round(at - step_wall, 1)})
    return out


def summarize(label: str, samples: list[dict[str, Any]], phase: dict[str, Any], lo: int,
              args: argparse.Namespace) -> dict[str, Any]:
    up, down = phase["step_up"], phase["step_down"]
    # Only a step that finds the minimum asked for has a decision to time (desired_at_step says otherwise).
    at_min = bool(samples) and samples[0]["desired"] == lo
    raised = next((s for s in samples if (s["desired"] or 0) > lo), None) if at_min else None
    decision = raised["t"] - up if raised else None
    # When the operator decided, by its own clock: lastScaleTime of that sample (whole seconds, truncated, so
    # this reads up to 1 s early), not when this bench's 1 s polling saw it (up to ~2 s late with kubectl).
    stamp = raised["last_scale"] if raised else None
    decided = (_dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.timezone.utc).timestamp()
               - phase["step_up_wall"]) if stamp else None
    peak_desired = max((s["desired"] or 0) for s in samples)
    registered = next((s["t"] - up for s in samples
                       if s["registered"] is not None and s["registered"] >= max(peak_desired, lo)), None)
    drained = next((s["t"] - down for s in samples
                    if s["t"] > down and s["lag"] is not None and s["lag"] <= args.base * 2), None)
    # The same window for every configuration: the step up to `--horizon` s after the step down.
    exec_seconds, prev, horizon = 0.0, None, down + args.horizon
    for s in samples:
        if prev is not None and prev["registered"] is not None and prev["t"] < horizon:
            exec_seconds += prev["registered"] * (min(s["t"], horizon) - prev["t"])
        prev = s
    uids = {uid for s in samples for uid, _ in s["drivers"]}
    restarts = max((r for s in samples for _, r in s["drivers"]), default=0) + max(0, len(uids) - 1)
    # When it happened (the restart count is the container's since the pod started: one before the step
    # shows in the first sample already).
    first = samples[0]["drivers"] if samples else []
    restart_t = next((round(s["t"] - up, 1) for s in samples if s["drivers"] != first), None)
    return {"config": label, "decision_s": _round(decision) if label.startswith("scaling") else None,
            "decision_status_s": _round(decided) if label.startswith("scaling") else None,
            "registered_s": _round(registered) if label.startswith("scaling") else None,
            "desired_at_step": samples[0]["desired"] if samples else None, "peak_desired": peak_desired, "lag_peak": max((s["lag"] or 0) for s in samples),
            "drain_s": _round(drained), "drained": drained is not None,
            "executor_seconds": round(exec_seconds, 1), "restarts": restarts,
            "restarts_before_step": max((r for _, r in first), default=0), "restart_t": restart_t,
            "decision_message": raised["message"] if raised else None,
            "samples": [{"t": round(s["t"] - up, 1), "desired": s["desired"], "registered": s["registered"],
                         "lag": s["lag"], "reason": s["reason"],
                         # The decision's numbers (lag, input rate, rate per executor), when they changed.
                         **({"message": s["message"]} if i == 0 or s["message"] != samples[i - 1]["message"]
                            else {})}
                        for i, s in enumerate(samples)]}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


@contextlib.contextmanager
def components(workdir: Path) -> Iterator[tuple[Any, Any]]:
    from handoff_testbed.registry import component

    started = []
    try:
        for name in ("postgres", "s3"):
            comp = component(name)
            comp.build()
            comp.start(workdir / name)
            started.append(comp)
        yield started[0], started[1]
    finally:
        for comp in started:
            comp.stop()


def each_on_node(workdir: Path, labels: list[str], run: Any) -> list[dict[str, Any]]:
    """`run(cluster, kafka, postgres, s3, label)` for each configuration, one after the other, on what a bench of pods
    runs on: the test bed's node, a broker the pods reach, PostgreSQL and S3 (moto)."""
    results = []
    with components(workdir) as (postgres, s3), testbed_cluster(workdir / "c") as cluster, \
            kafka_for_pods(cluster) as kafka:
        for label in labels:
            print(f"--- {label}", flush=True)
            results.append(run(cluster, kafka, postgres, s3, label))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=int, default=1500, help="records/s before and after the 4× step")
    parser.add_argument("--before", type=float, default=20, help="seconds at the base rate before the step")
    parser.add_argument("--high", type=float, default=60, help="seconds at 4× the base rate")
    parser.add_argument("--drain-limit", type=float, default=240, help="max seconds waiting for the drain")
    parser.add_argument("--horizon", type=float, default=60,
                        help="executor-seconds are counted from the step up to this many s after the step down, "
                             "the same window in every configuration")
    parser.add_argument("--max-records-per-batch", type=int, default=60_000,
                        help="the handoff's source.maxRecordsPerBatch: with a 2 s commit interval a backlog drains "
                             "at no more than this / 2 s whatever the executors, so it must stay above what the "
                             "largest configuration processes (20,000 until 2026-11-26 capped every row at "
                             "10,000/s, just above the 8,000/s step)")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra sparkConf for every configuration (repeatable)")
    parser.add_argument("--start-limit", type=float, default=420, help="max seconds for a driver to catch up")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="which of " + ", ".join(CONFIGS))
    parser.add_argument("--executor-cpu-request", default="200m",
                        help="each executor pod's CPU request (spark.kubernetes.executor.request.cores; at most "
                             "the limit)")
    parser.add_argument("--executor-cpu-limit", default="400m",
                        help="each executor pod's CPU limit (spark.kubernetes.executor.limit.cores; '' for none): "
                             "on a 2-CPU node an unlimited executor takes whatever CPU is free, so adding "
                             "executors adds no capacity; with a limit each one adds its share")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/scaling_live.json")
    parser.add_argument("--logs", default=str(ROOT / ".test-logs" / "bench-scaling-drivers"),
                        help="where each configuration's driver logs are saved")
    args = parser.parse_args()
    workdir = ROOT / ".test-logs" / f"bench-scaling-{os.getpid()}"
    load_before = os.getloadavg()

    def run(cluster: Cluster, kafka: Any, postgres: Any, s3: Any, label: str) -> dict[str, Any]:
        r = run_config(cluster, kafka, postgres, s3, label, CONFIGS[label], args)
        print({k: v for k, v in r.items() if k != "samples"}, flush=True)
        return r

    results = each_on_node(workdir, args.configs.split(","), run)
    report = {"bench": "scaling_live", "kind": "measured on the test bed's real node (shared 2 CPUs)",
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "load_before": [round(x, 2) for x in load_before],
                          "load_after": [round(x, 2) for x in os.getloadavg()]},
              "params": {"base": args.base, "high": args.base * 4, "before_s": args.before, "high_s": args.high,
                         "status_interval_s": 3, "scale_poll_s": 5, "targetCatchUp": "20s", "cooldown": "15s",
                         "maxRecordsPerBatch": args.max_records_per_batch, "partitions": 3,
                         "executor_seconds_window": f"step up → step down + {args.horizon:.0f} s",
                         "spark_conf": args.spark_conf,
                         "executor_cpu_request": args.executor_cpu_request, "executor_cpu_limit": args.executor_cpu_limit or None,
                         "speculation": STRAGGLER_CONF, "extra_conf": EXTRA_CONF},
              "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n| config | decision s (lastScaleTime) | registered s | warm s | peak desired | lag peak | drain s | "
          f"executor-s | "
          f"restarts |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        warm = max((w["t"] for w in r["warm_ups"] if w["t"] > 0), default=None)
        print(f"| {r['config']} | {r['decision_s']} ({r['decision_status_s']}) | {r['registered_s']} | {warm} | "
              f"{r['peak_desired']} | "
              f"{r['lag_peak']} | {r['drain_s'] if r['drained'] else 'not drained'} | {r['executor_seconds']} | "
              f"{r['restarts']} |")
    for r in results:
        if r["decision_message"]:
            print(f"{r['config']} decided: {r['decision_message']}")
    print(f"\nload average before {load_before}, after {os.getloadavg()}; JSON: {args.out}")


if __name__ == "__main__":
    main()
