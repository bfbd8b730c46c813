"""How the operator scales with the number of handoffs it watches (issue 16): N StreamTableHandoffs, one operator.

Set-up, as a new user would meet it: the test bed's Kafka (one 6-partition topic every handoff reads) and
kube-apiserver + controller-manager + scheduler + kwok (driver pods exist and go Running/Ready; nothing runs
in them, so no driver publishes a progress record and the status comes from polling the truth), one SQLite
Iceberg catalog holding one table per handoff with one ledger commit each, and `handoff operator` started as
a subprocess (`nice -n 10`) watching only the run's namespace. For each N (the first N is the baseline,
measured in the same run):

- settle: seconds from the start of a bulk `kubectl apply --server-side` of N handoffs until every one has
  status conditions and a lag;
- steady state: once no driver pod or Deployment changed for an interval (kwok takes a while to start N pods,
  and each pod change reconciles its handoff) and two intervals later, the operator process's CPU seconds (utime+stime from
  /proc/<pid>/stat, so other load on the machine inflates it much less than wall time) over `--steady` seconds
  while nothing changes, as cores, its RSS (VmRSS; VmHWM is the peak) and the Events posted, by reason;
- per handoff per refresh, over the same window: CPU ms, Kafka AdminClient calls and catalog reads (the
  operator's own counters `handoff_kafka_requests_total`, `handoff_catalog_reads_total` (ledger loads: the
  reads other than the metadata-pointer SELECTs that gate them), divided by
  `handoff_status_refreshes_total`), and apiserver requests (kube-apiserver's `apiserver_request_total`,
  writes = POST/PUT/PATCH/APPLY/DELETE, reads = GET/LIST, node and lease traffic of kwok left out);
- change latency: seconds from a new ledger commit in one handoff's table until its status shows that
  batch (the goal: within one refresh interval whatever N is).

    nice -n 10 .venv/bin/python bench/operator/handoff/operator_scale.py [--counts 10,200] [--steady 120] [--interval 15]
        [--label before] [--profile DIR]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
for sub in ("operator", "spark_app", "hack", "bench", "tests/integration"):
    sys.path.insert(0, str(ROOT / sub))

from operator_support import base_spec, install_crds, ledger_commit  # noqa: E402

TOPIC, PARTITIONS, RECORDS = "orders", 6, 6000
PODS_PER_NODE = 250  # the test bed's kwok node capacity
CLK_TCK = os.sysconf("SC_CLK_TCK")
WRITE_VERBS = {"POST", "PUT", "PATCH", "APPLY", "DELETE"}
READ_VERBS = {"GET", "LIST"}
IGNORED_RESOURCES = {"leases", "nodes", "tokenreviews", "subjectaccessreviews", "selfsubjectaccessreviews"}


# ------------------------------------------------------------------------------------------ measuring

def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def memory_mb(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


def scrape(url: str, token: str | None = None, ca: str | None = None) -> str:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=ca) if ca else None
    with urllib.request.urlopen(request, timeout=10, context=context) as resp:
        return resp.read().decode()


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)$')


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out.append((labels, float(m.group(3))))
    return out


def operator_counters(port: int) -> dict[str, float]:
    text = scrape(f"http://127.0.0.1:{port}/metrics")
    return {"refreshes": sum(v for _, v in samples(text, "handoff_status_refreshes_total")),
            "kafka": sum(v for _, v in samples(text, "handoff_kafka_requests_total")),
            "catalog": sum(v for _, v in samples(text, "handoff_catalog_reads_total")),
            # Table loads / ledger queries, without the cheap pointer SELECTs that gate them.
            "ledger": sum(v for labels, v in samples(text, "handoff_catalog_reads_total")
                          if labels.get("kind") != "iceberg_pointer")}


def apiserver_counters(api: Any) -> dict[str, float]:
    text = scrape(api.server + "/metrics", api.token, str(api.ca_cert))
    writes = reads = 0.0
    by_resource: dict[str, float] = {}
    reads_by_resource: dict[str, float] = {}
    for labels, value in samples(text, "apiserver_request_total"):
        if labels.get("resource") in IGNORED_RESOURCES:
            continue
        what = f"{labels.get('verb')} {labels.get('resource')}" + (
            f"/{labels['subresource']}" if labels.get("subresource") else "")
        if labels.get("verb") in WRITE_VERBS:
            writes += value
            by_resource[what] = by_resource.get(what, 0.0) + value
        elif labels.get("verb") in READ_VERBS:
            reads += value
            reads_by_resource[what] = reads_by_resource.get(what, 0.0) + value
    return {"writes": writes, "reads": reads, "by_resource": by_resource, "reads_by_resource": reads_by_resource}


def event_messages(core: Any, namespace: str, reason: str, limit: int = 3) -> list[str]:
    """A few distinct messages of the Events with `reason` (why pods did not schedule, say)."""
    seen: list[str] = []
    for event in core.list_namespaced_event(namespace, field_selector=f"reason={reason}").items:
        if event.message and event.message not in seen:
            seen.append(event.message)
    return seen[:limit]


def nodes_ready(core: Any) -> tuple[int, int]:
    """(Ready, all) nodes: kwok nodes declared NotReady get tainted, and their pods evicted and unschedulable."""
    items = core.list_node().items
    ready = sum(1 for n in items for c in (n.status.conditions or []) if c.type == "Ready" and c.status == "True")
    return ready, len(items)


class StatusChanges:
    """Which top-level `status` fields the handoffs' updates changed, counted over a window: what a status patch
    carried (a watch of the handoffs in a thread; the first event per handoff is the baseline, not a change)."""

    def __init__(self, custom: Any, namespace: str) -> None:
        import threading

        self._custom, self._namespace = custom, namespace
        self._last: dict[str, dict[str, Any]] = {}
        self.first_seen: dict[str, dict[str, float]] = {"conditions": {}, "lag": {}}  # name → monotonic time
        self.by_field: dict[str, int] = {}
        self.updates = 0
        self._counting = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(self._custom.list_namespaced_custom_object, "handoff.io", "v1alpha1",
                                           self._namespace, "streamtablehandoffs", timeout_seconds=30):
                    obj = event["object"]
                    name, status = obj["metadata"]["name"], obj.get("status") or {}
                    before = self._last.get(name)
                    self._last[name] = status
                    for key, first in self.first_seen.items():
                        if name not in first and status.get(key) not in (None, [], {}):
                            first[name] = time.monotonic()
                    if self._counting and before is not None and event["type"] == "MODIFIED":
                        self.updates += 1
                        for key in set(before) | set(status):
                            if before.get(key) != status.get(key):
                                self.by_field[key] = self.by_field.get(key, 0) + 1
                    if self._stop.is_set():
                        break
            except Exception:  # noqa: BLE001 - a dropped watch is restarted; the counts stay approximate
                time.sleep(1)

    def start(self) -> "StatusChanges":
        self._thread.start()
        return self

    def count(self, on: bool) -> None:
        if on:
            self.by_field, self.updates = {}, 0
        self._counting = on

    def stop(self) -> None:
        self._stop.set()

    def timeline(self, since: float) -> dict[str, dict[str, float]]:
        """When the handoffs first had conditions, and a lag: p50/p90/max seconds after `since` (the apply)."""
        out = {}
        for key, first in self.first_seen.items():
            times = sorted(t - since for t in first.values())
            if times:
                out[key] = {"count": len(times), "p50": round(times[len(times) // 2], 1),
                            "p90": round(times[int(len(times) * 0.9)], 1), "max": round(times[-1], 1)}
        return out


def event_counts(core: Any, namespace: str) -> dict[str, int]:
    """Events posted in the namespace so far, by reason (an Event repeated counts its `count`)."""
    out: dict[str, int] = {}
    for event in core.list_namespaced_event(namespace).items:
        out[event.reason or ""] = out.get(event.reason or "", 0) + (event.count or 1)
    return out


# ------------------------------------------------------------------------------------------ set-up

def ensure_nodes(core: Any, pods: int) -> None:
    """Enough kwok nodes for `pods` driver pods (kwok manages every node carrying its annotation)."""
    from handoff_testbed.apiserver import FAKE_NODE, KWOK_ANNOTATION
    from kubernetes.client.rest import ApiException

    key, value = KWOK_ANNOTATION
    for i in range(1, math.ceil(pods / PODS_PER_NODE) + 1):
        name = f"{FAKE_NODE[:-2]}-{i}"
        try:
            core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": name, "annotations": {key: value},
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"}},
                # CPU and memory for PODS_PER_NODE driver pods (their requests), so pods, not CPU, bound a node:
                # with 64 CPUs the 1,000-handoff run left drivers Pending (Insufficient cpu) and never settled.
                "status": {"allocatable": {"cpu": "2000", "memory": "8Ti", "pods": str(PODS_PER_NODE)},
                           "capacity": {"cpu": "2000", "memory": "8Ti", "pods": str(PODS_PER_NODE)}}})
        except ApiException as exc:
            if exc.status != 409:
                raise


def make_tables(workdir: Path, namespace: str, count: int, end: dict[int, int]) -> tuple[dict[str, str], list[Any]]:
    """A SQLite catalog with table shop.t<i> per handoff, each with one ledger commit of half the topic."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    props = {"type": "sql", "uri": f"sqlite:///{workdir}/catalog.db", "warehouse": f"file://{workdir}/warehouse"}
    catalog = SqlCatalog("lake", **{k: v for k, v in props.items() if k != "type"})
    catalog.create_namespace("shop")
    tables = []
    offsets = {TOPIC: {str(p): [0, e // 2] for p, e in end.items()}}
    for i in range(count):
        table = catalog.create_table(f"shop.t{i}", Schema(NestedField(1, "id", LongType(), required=False)))
        ledger_commit(table, f"{namespace}/h{i}", 0, offsets, int(time.time() * 1000), 1)
        tables.append(table)
    return props, tables


def manifests(namespace: str, count: int, bootstrap: str, catalog: dict[str, str]) -> str:
    from handoff_operator import yaml_text

    docs = []
    for i in range(count):
        spec = base_spec(bootstrap)
        spec["source"]["topics"] = [TOPIC]
        spec["sink"] = {"iceberg": {"catalog": {"name": "lake", "properties": catalog}, "table": f"shop.t{i}"}}
        spec["checkpoint"] = {"location": f"file:///tmp/handoff-bench/{namespace}/h{i}"}
        spec["schema"] = {"columns": [{"name": "id", "type": "long"}]}
        docs.append(yaml_text.dump({"apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
                                "metadata": {"name": f"h{i}", "namespace": namespace}, "spec": spec}))
    return "---\n".join(docs)


def free_port() -> int:
    from handoff_testbed.proc import free_port as port

    return port()


# ------------------------------------------------------------------------------------------ one run

def run(n: int, args: argparse.Namespace, api: Any, bootstrap: str, end: dict[int, int], workdir: Path) -> dict:
    from kubernetes import client, config

    kube = config.new_client_from_config(config_file=str(api.kubeconfig))
    core, custom = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    namespace = f"scale-{n}-{os.getpid() % 10000}"
    core.create_namespace({"metadata": {"name": namespace}})
    ensure_nodes(core, n + 260)
    rundir = workdir / namespace
    rundir.mkdir()
    t = time.monotonic()
    catalog, tables = make_tables(rundir, namespace, n, end)
    print(f"  N={n}: {n} tables with a ledger commit in {time.monotonic() - t:.0f} s", flush=True)

    port = free_port()
    env = {**os.environ, "KUBECONFIG": str(api.kubeconfig), "HANDOFF_METRICS_PORT": str(port),
           "HANDOFF_STATUS_INTERVAL": str(args.interval), "HANDOFF_LOG_LEVEL": "WARNING",
           "HANDOFF_DEFAULT_IMAGE": "registry.test/handoff-spark:bench",
           # This checkout's code, also when the bench runs from a copy (a baseline of another commit).
           "PYTHONPATH": os.pathsep.join(str(ROOT / d) for d in ("operator", "spark_app"))}
    from handoff_testbed.proc import Service

    proc = Service("operator", ["nice", "-n", "10", sys.executable, "-m", "handoff_operator", "operator", "-n",
                                namespace], rundir / "operator.log", env=env).start()
    assert proc.pid is not None
    try:
        deadline = time.monotonic() + 300  # importing the operator takes a while on a loaded machine
        while True:
            try:
                operator_counters(port)
                break
            except OSError:
                if time.monotonic() > deadline or not proc.alive():
                    raise RuntimeError(f"the operator did not start; see {rundir / 'operator.log'}")
                time.sleep(0.3)
        time.sleep(2)  # kopf's watch is up
        path = rundir / "handoffs.yaml"
        path.write_text(manifests(namespace, n, bootstrap, catalog))
        settle_profiler = None
        if args.profile:  # the create path: from the bulk apply until all have conditions and lag
            settle_profiler = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(proc.pid), "-r", "50", "--gil",
                 "-f", "raw", "-o", str(Path(args.profile) / f"operator-{n}-settle.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        changes = StatusChanges(custom, namespace).start()
        events_at_apply = event_counts(core, namespace)
        api_at_apply = apiserver_counters(api)
        applied = time.monotonic()
        out = subprocess.run(["kubectl", "--kubeconfig", str(api.kubeconfig), "apply", "--server-side", "-f",
                              str(path)], capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"kubectl apply: {out.stderr[-2000:]}")
        apply_seconds = time.monotonic() - applied
        apply_done = time.monotonic()
        settled = settled_after_apply = None
        while time.monotonic() - applied < args.settle_timeout:
            items = custom.list_namespaced_custom_object("handoff.io", "v1alpha1", namespace,
                                                         "streamtablehandoffs")["items"]
            done = sum(1 for o in items if (o.get("status") or {}).get("conditions")
                       and (o.get("status") or {}).get("lag") is not None)
            if done == n:
                settled, settled_after_apply = time.monotonic() - applied, time.monotonic() - apply_done
                break
            time.sleep(1)
        settle_timeline = changes.timeline(applied)
        api_at_settle = apiserver_counters(api)
        # What creating one handoff cost in API requests, by verb and resource (kubectl's own applies included).
        settle_requests = {k: round((v - {**api_at_apply["by_resource"], **api_at_apply["reads_by_resource"]}
                                     .get(k, 0.0)) / n, 2)
                           for k, v in sorted({**api_at_settle["by_resource"],
                                               **api_at_settle["reads_by_resource"]}.items())}
        settle_requests = {k: v for k, v in settle_requests.items() if v > 0}
        # Which Events creating them posted (the operator's and the controllers'), per handoff.
        settle_events = {k: round((v - events_at_apply.get(k, 0)) / n, 2)
                         for k, v in sorted(event_counts(core, namespace).items()) if v > events_at_apply.get(k, 0)}
        if settle_profiler is not None:
            settle_profiler.send_signal(signal.SIGINT)  # py-spy writes its samples on SIGINT
            settle_profiler.wait(60)
        print(f"  N={n}: apply {apply_seconds:.1f} s, all with conditions and lag after "
              f"{settled if settled is None else round(settled, 1)} s", flush=True)

        # Steady means nothing changes: kwok takes a while to start N pods (and the test bed's node lifecycle may
        # evict and recreate some), and every driver pod or Deployment change reconciles its handoff. Wait until
        # none of them has changed for one interval, then two intervals for the bulk apply's burst to end.
        quiet_since, last, children_quiet = time.monotonic(), None, None
        while time.monotonic() - applied < args.settle_timeout:
            now_children = sorted((o.metadata.name, o.metadata.resource_version) for o in
                                  core.list_namespaced_pod(namespace).items
                                  + client.AppsV1Api(kube).list_namespaced_deployment(namespace).items)
            if now_children != last:
                quiet_since, last = time.monotonic(), now_children
            elif time.monotonic() - quiet_since >= args.interval:
                children_quiet = round(quiet_since - applied, 1)
                break
            time.sleep(2)
        print(f"  N={n}: driver pods and Deployments unchanged from {children_quiet} s", flush=True)
        time.sleep(args.interval * 2)
        events0 = event_counts(core, namespace)
        ready0 = nodes_ready(core)
        changes.count(True)
        load0, cpu0, ops0, api0, w0 = os.getloadavg()[0], cpu_seconds(proc.pid), operator_counters(port), \
            apiserver_counters(api), time.monotonic()
        profiler = None
        if args.profile:  # sampling the operator's Python stacks over the window (costs it some CPU: not for tables)
            profiler = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(proc.pid),
                                         "-d", str(int(args.steady)), "-r", "50", "--gil", "-f", "raw", "-o",
                                         str(Path(args.profile) / f"operator-{n}.txt")], stdout=subprocess.DEVNULL)
        time.sleep(args.steady)
        if profiler is not None:
            profiler.wait(60)
        load1, cpu1, ops1, api1, w1 = os.getloadavg()[0], cpu_seconds(proc.pid), operator_counters(port), \
            apiserver_counters(api), time.monotonic()
        changes.count(False)
        changes.stop()
        ready1 = nodes_ready(core)
        mem = memory_mb(proc.pid)
        events1 = event_counts(core, namespace)
        wall = w1 - w0
        refreshes = ops1["refreshes"] - ops0["refreshes"]
        cpu = cpu1 - cpu0

        def per(value: float) -> float | None:
            return round(value / refreshes, 3) if refreshes else None

        # A change: a new batch committed to h0's table, until h0's status shows it.
        ledger_commit(tables[0], f"{namespace}/h0", 1, {TOPIC: {str(p): [e // 2, e] for p, e in end.items()}},
                      int(time.time() * 1000), 1)
        changed = time.monotonic()
        change_seconds = None
        while time.monotonic() - changed < args.interval * 4:
            status = custom.get_namespaced_custom_object("handoff.io", "v1alpha1", namespace,
                                                         "streamtablehandoffs", "h0").get("status") or {}
            if (status.get("committed") or {}).get("batch") == 1:
                change_seconds = round(time.monotonic() - changed, 1)
                break
            time.sleep(0.2)
        result = {
            "handoffs": n, "apply_seconds": round(apply_seconds, 1),
            "seconds_until_all_have_conditions_and_lag": None if settled is None else round(settled, 1),
            "seconds_from_apply_end_until_all_have_conditions_and_lag":
                None if settled_after_apply is None else round(settled_after_apply, 1),
            "steady_window_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
            "cores": round(cpu / wall, 3), "rss_mb": mem.get("VmRSS"), "peak_rss_mb": mem.get("VmHWM"),
            "refreshes": int(refreshes), "refreshes_per_handoff_per_interval": round(
                refreshes / n / (wall / args.interval), 2),
            "per_handoff_per_refresh": {
                "cpu_ms": per(cpu * 1000), "kafka_requests": per(ops1["kafka"] - ops0["kafka"]),
                "catalog_reads": per(ops1["catalog"] - ops0["catalog"]),
                "ledger_loads": per(ops1["ledger"] - ops0["ledger"]),
                "apiserver_writes": per(api1["writes"] - api0["writes"]),
                "apiserver_reads": per(api1["reads"] - api0["reads"])},
            "new_batch_to_status_seconds": change_seconds,
            "seconds_until_driver_pods_and_deployments_unchanged": children_quiet,
            "events_by_reason": {k: v - events0.get(k, 0) for k, v in sorted(events1.items())
                                 if v - events0.get(k, 0) > 0},
            "apiserver_writes_by_resource": {k: per(v - api0["by_resource"].get(k, 0.0))
                                             for k, v in sorted(api1["by_resource"].items())
                                             if v - api0["by_resource"].get(k, 0.0) > 0},
            "apiserver_reads_by_resource": {k: per(v - api0["reads_by_resource"].get(k, 0.0))
                                            for k, v in sorted(api1["reads_by_resource"].items())
                                            if v - api0["reads_by_resource"].get(k, 0.0) > 0},
            "load_average": [round(load0, 2), round(load1, 2)],
            "nodes_ready_at_window_start_and_end": [list(ready0), list(ready1)],
            "failed_scheduling_messages": event_messages(core, namespace, "FailedScheduling"),
            # What the handoffs' updates in the window changed (status fields), per refresh.
            "first_conditions_and_lag_after_apply_start": settle_timeline,
            "apiserver_requests_per_handoff_until_settled": settle_requests,
            "events_per_handoff_until_settled": settle_events,
            "handoff_updates_per_refresh": per(changes.updates),
            "status_fields_changed_per_refresh": {k: per(v) for k, v in sorted(changes.by_field.items())},
        }
        print(f"  N={n}: {json.dumps(result)}", flush=True)
        return result
    finally:
        proc.stop(30)


def table(results: list[dict]) -> str:
    head = ("| handoffs | all have conditions+lag (s) | steady CPU (cores) | RSS MB | CPU ms | Kafka req | "
            "catalog reads (ledger loads) | apiserver writes | apiserver reads | new batch → status (s) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        p = r["per_handoff_per_refresh"]
        lines.append(f"| {r['handoffs']} | {r['seconds_until_all_have_conditions_and_lag']} | {r['cores']} | "
                     f"{r['rss_mb']} | {p['cpu_ms']} | {p['kafka_requests']} | {p['catalog_reads']} "
                     f"({p.get('ledger_loads', p['catalog_reads'])}) | "
                     f"{p['apiserver_writes']} | {p['apiserver_reads']} | {r['new_batch_to_status_seconds']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="10,200", help="handoff counts, the first is the baseline")
    ap.add_argument("--steady", type=float, default=120.0, help="seconds of steady state measured")
    ap.add_argument("--interval", type=float, default=15.0, help="HANDOFF_STATUS_INTERVAL")
    ap.add_argument("--settle-timeout", type=float, default=600.0)
    ap.add_argument("--profile", default="", help="a directory: py-spy samples of the steady window per N "
                    "(collapsed stacks, operator-<N>.txt; needs py-spy in the venv)")
    ap.add_argument("--label", default="", help="suffix of the result file (e.g. before, after)")
    args = ap.parse_args()
    # Stopped with SIGTERM (timeout, kill): unwind, so the operator, the API server and Kafka stop with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    counts = [int(c) for c in args.counts.split(",")]

    from bench_kafka import broker
    from confluent_kafka import Producer
    from handoff_testbed.registry import component

    workdir = Path(tempfile.mkdtemp(prefix="bench-operator-scale-"))
    api = component("apiserver")
    api.build()
    api.start(workdir / "apiserver")
    try:
        with broker(None) as (bootstrap, kafka):
            kafka.create_topic(TOPIC, PARTITIONS)
            producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
            for i in range(RECORDS):
                producer.produce(TOPIC, key=str(i).encode(), value=b"{}", partition=i % PARTITIONS)
            producer.flush(30)
            del producer
            end = {p: RECORDS // PARTITIONS for p in range(PARTITIONS)}
            install_crds(str(api.kubeconfig))
            results = [run(n, args, api, bootstrap, end, workdir) for n in counts]
    finally:
        api.stop()
    doc = {"bench": "operator_scale", "label": args.label, "interval_seconds": args.interval,
           "steady_seconds": args.steady, "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "results": results}
    name = "operator_scale" + (f"_{args.label}" if args.label else "") + ".json"
    out = ROOT / "bench/results" / name
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(table(results))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
