"""A replay's restart: the query started again inside the running driver (the operator's query hold,
`handoff_spark.driver.hold`) against a new driver process (what stopping the driver pod costs: the baseline),
measured in the same run, on the same broker, table and checkpoint, while records keep arriving.

Setup: the test bed's Kafka and kube-apiserver (the hold travels as in a cluster: an annotation on the progress
ConfigMap, the driver's acknowledgement in its published record), a 2-partition topic with a producer writing
`--rate` records/s, and one Handoff driver (`python -m handoff_spark run`, Spark local mode, Iceberg table in a
SQLite catalog) with the operator's ConfigMap environment. Each of `--cycles` cycles measures, one after the other:
- `query held`: annotate `handoff.io/query-hold`; *stop* = until the driver publishes `queryHeld` (its query
  stopped at a batch boundary); lift it; *resume* = from the lift until the table's first new commit (the Iceberg
  snapshot's own timestamp, so the driver's half-second progress poll is not in the figure);
- `driver restarted`: SIGTERM to the driver; *stop* = until the process exited; a new driver process is started
  at once; *resume* = from its start until the table's first new commit. This is a pod's restart without the
  pod: no image pull, no scheduling, no container start, so a real pod takes longer.
With `--transform` the driver runs a transform (the DataFrame path), and each cycle also measures
- `transform changed`: write the operator's `handoff.io/query-config` with a new SQL (another derived `note`);
  *stop* = until the driver publishes that it runs it (`configHash`: its query stopped at a batch boundary, the SQL
  checked, the query started again; `driver.query_config`); *resume* = from then until the table's first new
  commit. The `driver restarted` baseline then starts its new process with the SQL last set, as a pod would.
With `--switch` the driver starts without a transform (the fused path), and each cycle also measures
- `transform added`: the query config with a transform; the running driver's query moves to the DataFrame path (the
  fused path's checkpoint discarded, the start planned from the ledger); *stop* and *resume* as above;
- `transform removed`: the query config without it; the query moves back to the fused path the same way.
  The baseline's new process then runs the fused path, as a new pod would.
No rollback happens in between (its table steps are the same in both cases and measured by
bench/operator/replay/replay.py), so neither restart discards its checkpoint. At the end the producer stops, the
driver catches up, and the table is checked: rows == distinct (partition, offset) == produced.
Prints a table and writes bench/results/query_hold.json.

    .venv/bin/python bench/spark/driver/query_hold.py [--cycles 3] [--rate 500] [--transform | --switch]
        [--bootstrap HOST:PORT]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "spark_app"), str(ROOT / "operator"), str(ROOT / "hack"), str(ROOT / "bench")]

from bench_kafka import add_broker_argument, broker  # noqa: E402
from bench_pipelines import order_value  # noqa: E402
from bench_report import add_out_argument, machine_facts, write_json  # noqa: E402

COLUMNS = [{"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamp"},
           {"name": "customer", "type": "string"}, {"name": "amount", "type": "double"},
           {"name": "region", "type": "string"}, {"name": "note", "type": "string"}]
NAMESPACE, HANDOFF = "bench-hold", "orders"
CONFIGMAP = f"{HANDOFF}-progress"
#: The pod template hash the driver is told it runs (HANDOFF_POD_CONFIG_HASH) and the query configs are made for.
POD_HASH = "bench-pod"


def transform_sql(version: int) -> str:
    """The `--transform` SQL, version `version`: every record kept, its `note` derived (so the table stays whole)."""
    return (f"SELECT id, ts, customer, amount, region, concat('v{version}-', customer) AS note, _kafka_topic, "
            f"_kafka_partition, _kafka_offset, _kafka_timestamp FROM source")


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 300.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"timed out waiting for {what}")


class Trickle:
    """Produces `rate` records/s (in tenths of a second) until stopped; `.produced` counts them."""

    def __init__(self, bootstrap: str, topic: str, rate: int) -> None:
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic, self.rate, self.produced = topic, rate, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        per_tick = max(1, self.rate // 10)
        while not self.stop.is_set():
            for _ in range(per_tick):
                self.producer.produce(self.topic, order_value(self.produced))
                self.produced += 1
            self.producer.poll(0)
            self.stop.wait(0.1)
        self.producer.flush(30)


class Driver:
    """One `handoff_spark run` process with the operator's ConfigMap environment."""

    def __init__(self, app_json: Path, log: Path, kubeconfig: Path) -> None:
        self.app_json, self.log, self.kubeconfig = app_json, log, kubeconfig
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "spark_app"), str(ROOT / "hack")]),
               "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
               "KUBECONFIG": str(self.kubeconfig), "HANDOFF_PROGRESS_CONFIGMAP": CONFIGMAP,
               "HANDOFF_PROGRESS_NAMESPACE": NAMESPACE, "HANDOFF_PROGRESS_PUBLISH_SECONDS": "2",
               "HANDOFF_POD_CONFIG_HASH": POD_HASH}
        with self.log.open("a") as fh:
            self.proc = subprocess.Popen([sys.executable, "-m", "handoff_spark", "run", "--config",
                                          str(self.app_json)], stdout=fh, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

    def terminate(self) -> None:
        """SIGTERM to the driver only (as the kubelet does to the container's main process): it finishes its
        micro-batch and exits."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--rate", type=int, default=500, help="records per second while the cycles run")
    ap.add_argument("--transform", action="store_true",
                    help="run a transform, and measure its change in the running driver too")
    ap.add_argument("--switch", action="store_true",
                    help="run no transform, and measure adding one and removing it in the running driver too")
    add_broker_argument(ap)
    add_out_argument(ap, "query_hold.json")
    args = ap.parse_args(argv)
    if args.transform and args.switch:
        ap.error("--transform and --switch measure different starts; give one")
    from kubernetes import client, config

    from handoff_spark.config import AppConfig
    from handoff_spark.contract import (CONFIG_HASH_KEY, CONFIG_SINCE_KEY, PROGRESS_DATA_KEY, QUERY_CONFIG_ANNOTATION,
                                        QUERY_HELD_KEY, QUERY_HOLD_ANNOTATION)
    from handoff_spark.iceberg import ledger
    from handoff_testbed.apiserver import ApiServer

    tmp = Path(tempfile.mkdtemp(prefix="bench-hold-"))
    api = ApiServer()
    api.fake_nodes = False
    api.build()
    with broker(args.bootstrap) as (bootstrap, kafka):
        api.start(tmp / "apiserver")
        driver: Driver | None = None
        trickle: Trickle | None = None
        try:
            assert api.kubeconfig is not None
            core = client.CoreV1Api(config.new_client_from_config(config_file=str(api.kubeconfig)))
            core.create_namespace({"metadata": {"name": NAMESPACE}})
            core.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": CONFIGMAP}})
            topic = f"hold-{uuid.uuid4().hex[:6]}"
            for name, partitions in [(topic, 2)] + ([(f"{topic}-dlq", 1)] if args.transform or args.switch
                                                    else []):
                if kafka is not None:
                    kafka.create_topic(name, partitions=partitions)
                else:
                    from confluent_kafka.admin import AdminClient, NewTopic

                    AdminClient({"bootstrap.servers": bootstrap}).create_topics(
                        [NewTopic(name, partitions, 1)])[name].result(30)
            props = {"type": "sql", "uri": f"sqlite:///{tmp}/catalog.db", "warehouse": f"file://{tmp}/warehouse"}
            cfg = AppConfig.model_validate({
                "handoffId": f"{NAMESPACE}/{HANDOFF}", "source": {"bootstrapServers": bootstrap, "topics": [topic]},
                "sink": {"kind": "iceberg", "catalogName": "bench", "catalogProperties": props,
                         "table": "bench.orders"},
                "schema": {"columns": COLUMNS, "onIncompatible": "halt"},
                "checkpointLocation": str(tmp / "checkpoint"), "triggerIntervalSeconds": 0.5,
                "sparkConf": {"spark.master": "local[2]", "spark.sql.shuffle.partitions": "2"},
                **({"transform": {"sql": transform_sql(0)}} if args.transform else {}),
                **({"deadLetterTopic": f"{topic}-dlq"} if args.transform or args.switch else {})})
            app_json = tmp / "app.json"
            app_json.write_text(cfg.to_json())
            version = 0

            configs = itertools.count()

            def set_transform(v: int | None) -> str:
                """The operator's query config of SQL version `v` (None: no transform, the fused path) on the
                ConfigMap, and in app.json (what a new pod would mount); its config hash."""
                config_hash = f"bench-{next(configs)}"
                doc = {"configHash": config_hash, "podConfigHash": POD_HASH,
                       "transform": None if v is None else {"sql": transform_sql(v), "lookups": []}}
                core.patch_namespaced_config_map(CONFIGMAP, NAMESPACE, {"metadata": {"annotations": {
                    QUERY_CONFIG_ANNOTATION: json.dumps(doc)}}})
                app_json.write_text(AppConfig.model_validate({**json.loads(cfg.to_json()),
                                                              "transform": doc["transform"]}).to_json())
                return config_hash

            def record() -> dict[str, Any]:
                data = core.read_namespaced_config_map(CONFIGMAP, NAMESPACE).data or {}
                try:
                    return json.loads(data.get(PROGRESS_DATA_KEY) or "{}")
                except json.JSONDecodeError:
                    return {}

            if args.transform:
                set_transform(version)

            def newest_commit_ms() -> int:
                try:
                    snap = ledger.load_table("bench", props, "bench.orders").metadata.current_snapshot()
                except Exception:  # noqa: BLE001 - not created yet
                    return 0
                return snap.timestamp_ms if snap is not None else 0

            def commit_after(wall_ms: int) -> int | None:
                at = newest_commit_ms()
                return at if at > wall_ms else None

            def annotations() -> dict[str, str]:
                return core.read_namespaced_config_map(CONFIGMAP, NAMESPACE).metadata.annotations or {}

            def held(request: str) -> bool:
                data = core.read_namespaced_config_map(CONFIGMAP, NAMESPACE).data or {}
                try:
                    return json.loads(data.get(PROGRESS_DATA_KEY) or "{}").get(QUERY_HELD_KEY) == request
                except json.JSONDecodeError:
                    return False

            def hold(request: str | None) -> None:
                core.patch_namespaced_config_map(CONFIGMAP, NAMESPACE, {"metadata": {"annotations": {
                    QUERY_HOLD_ANNOTATION: request}}})

            trickle = Trickle(bootstrap, topic, args.rate)
            trickle.thread.start()
            driver = Driver(app_json, tmp / "driver.log", api.kubeconfig)
            driver.start()
            first = wait_for("the first commit", lambda: commit_after(0), timeout=600)
            wait_for("a few batches", lambda: commit_after(first + 3000), timeout=300)
            rows: list[dict[str, Any]] = []
            load_before = os.getloadavg()
            for cycle in range(args.cycles):
                request = f"bench-{cycle}"
                t = time.monotonic()
                hold(request)
                wait_for(f"{request} acknowledged", lambda: held(request), timeout=300, interval=0.1)
                stop_s = time.monotonic() - t
                lifted_ms = int(time.time() * 1000)
                hold(None)
                resumed_ms = wait_for(f"a commit after {request}", lambda: commit_after(lifted_ms))
                assert QUERY_HOLD_ANNOTATION not in annotations()
                rows.append({"cycle": cycle, "how": "query held", "stop_seconds": round(stop_s, 2),
                             "resume_seconds": round((resumed_ms - lifted_ms) / 1000, 2)})
                print(f"cycle {cycle}: query held    stop {stop_s:5.2f} s, resume {rows[-1]['resume_seconds']:5.2f} s",
                      flush=True)
                changes: list[tuple[str, int | None]] = []
                if args.transform:
                    version += 1
                    changes = [("transform changed", version)]
                elif args.switch:
                    changes = [("transform added", cycle + 1), ("transform removed", None)]
                for how, sql_version in changes:
                    changed_ms = int(time.time() * 1000)
                    wanted = set_transform(sql_version)
                    since_ms = wait_for(f"the driver running {how} ({wanted})",
                                        lambda: (r := record()).get(CONFIG_HASH_KEY) == wanted and r[CONFIG_SINCE_KEY],
                                        timeout=300, interval=0.1)
                    resumed_ms = wait_for(f"a commit after {how} ({wanted})", lambda: commit_after(since_ms))
                    rows.append({"cycle": cycle, "how": how,
                                 "stop_seconds": round((since_ms - changed_ms) / 1000, 2),
                                 "resume_seconds": round((resumed_ms - since_ms) / 1000, 2)})
                    print(f"cycle {cycle}: {how:17s} stop {rows[-1]['stop_seconds']:5.2f} s, resume "
                          f"{rows[-1]['resume_seconds']:5.2f} s", flush=True)
                t = time.monotonic()
                driver.terminate()
                stop_s = time.monotonic() - t
                started_ms = int(time.time() * 1000)
                driver.start()
                resumed_ms = wait_for(f"a commit of the new driver in cycle {cycle}",
                                      lambda: commit_after(started_ms), timeout=600)
                rows.append({"cycle": cycle, "how": "driver restarted", "stop_seconds": round(stop_s, 2),
                             "resume_seconds": round((resumed_ms - started_ms) / 1000, 2)})
                print(f"cycle {cycle}: driver restart stop {stop_s:5.2f} s, resume {rows[-1]['resume_seconds']:5.2f} s",
                      flush=True)
            load_after = os.getloadavg()
            trickle.stop.set()
            trickle.thread.join(60)
            produced = trickle.produced
            table_rows = wait_for("the table caught up", lambda: _caught_up(props, produced), timeout=300,
                                  interval=1)
        finally:
            if trickle is not None:
                trickle.stop.set()
            if driver is not None and driver.proc is not None:
                driver.terminate()
            api.stop()
    rows_n, distinct = table_rows
    whole = rows_n == distinct == produced

    def median(how: str, key: str) -> float:
        return round(statistics.median(r[key] for r in rows if r["how"] == how), 2)

    kinds = (("query held", "transform changed", "driver restarted") if args.transform else
             ("query held", "transform added", "transform removed", "driver restarted") if args.switch else
             ("query held", "driver restarted"))
    summary = {how: {"stop_seconds_median": median(how, "stop_seconds"),
                     "resume_seconds_median": median(how, "resume_seconds")} for how in kinds}
    ratio = round(summary["query held"]["resume_seconds_median"]
                  / summary["driver restarted"]["resume_seconds_median"], 2)
    print("\n| restart | stop (median s) | resume: to the first new commit (median s) |\n|---|---|---|")
    for how, figures in summary.items():
        label = how + (" (baseline)" if how == "driver restarted" else "")
        print(f"| {label} | {figures['stop_seconds_median']} | {figures['resume_seconds_median']} |")
    print(f"\nresume ratio held / restarted: {ratio}; table whole: {whole} ({rows_n} rows, {distinct} distinct, "
          f"{produced} produced); load average {load_before} → {load_after}")
    if args.transform:
        changed = summary["transform changed"]
        restarted = summary["driver restarted"]
        total_ratio = round((changed["stop_seconds_median"] + changed["resume_seconds_median"])
                            / (restarted["stop_seconds_median"] + restarted["resume_seconds_median"]), 2)
        print(f"transform changed in the driver / driver restarted, stop + resume: {total_ratio}")
        extra: dict[str, Any] = {"transform": True, "transform_total_ratio": total_ratio}
    elif args.switch:
        restarted = summary["driver restarted"]
        extra = {"transform": False, "switch": True}
        for how in ("transform added", "transform removed"):
            figures = summary[how]
            extra[f"{how.replace(' ', '_')}_total_ratio"] = round(
                (figures["stop_seconds_median"] + figures["resume_seconds_median"])
                / (restarted["stop_seconds_median"] + restarted["resume_seconds_median"]), 2)
            print(f"{how} in the driver / driver restarted, stop + resume: "
                  f"{extra[how.replace(' ', '_') + '_total_ratio']}")
    else:
        extra = {"transform": False}
    write_json(args.out, {"cycles": rows, "summary": summary, "resume_ratio": ratio, "rate": args.rate, **extra,
                          "produced": produced, "table_rows": rows_n, "table_distinct_offsets": distinct,
                          "table_whole": whole, "load_avg_before": load_before, "load_avg_after": load_after,
                          **machine_facts()})
    return 0 if whole else 1


def _caught_up(props: dict[str, str], produced: int) -> tuple[int, int] | None:
    from handoff_spark.iceberg import ledger

    table = ledger.load_table("bench", props, "bench.orders")
    data = table.scan(selected_fields=("_kafka_partition", "_kafka_offset")).to_arrow()
    if data.num_rows < produced:
        return None
    return data.num_rows, len(set(zip(data["_kafka_partition"].to_pylist(), data["_kafka_offset"].to_pylist())))


if __name__ == "__main__":
    sys.exit(main())
