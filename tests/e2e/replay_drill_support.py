"""What the ReplayRequest drills share, whatever the sink (test_operator_replay_drill.py on Iceberg,
test_operator_replay_bigquery_drill.py on the BigQuery emulator): a producer, Kafka's end offsets, and the test
playing the kubelet for the driver Deployment (a real driver process, started and stopped as its replicas say)."""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

from confluent_kafka import Producer
from kubernetes.client.rest import ApiException

from handoff_spark.config import AppConfig
from handoff_testbed.process_tree import kill_tree
from iceberg_drill_support import end_offsets
from operator_support import REPO, Cluster, Operator, base_spec, eventually

PY = sys.executable


def produce(bootstrap: str, topic: str, ids: range, *, note: bool = False) -> None:
    """Orders `ids` (id, ts a minute apart, region), each with a field `note` (n<id>) when `note`."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in ids:
        ts = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=i)
        value = {"id": i, "ts": ts.isoformat(), "region": ["eu", "us", "ap"][i % 3]}
        if note:
            value["note"] = f"n{i}"
        producer.produce(topic, key=str(i).encode(), value=json.dumps(value).encode())
    assert producer.flush(30) == 0


def iceberg_spec(bootstrap: str, topic: str, tmp_path: Path, table: str, **overrides: Any) -> dict[str, Any]:
    """A handoff spec for the drills that run a local driver: `topic` into `table` of a SQLite catalog under
    `tmp_path` (one commit a second, at most 400 records a batch), columns id/ts/region, its checkpoint there too."""
    spec = base_spec(bootstrap, commitInterval="1s", freshness={"target": "5m"}, **overrides)
    spec["source"].update(topics=[topic], maxRecordsPerBatch=400)
    spec["sink"]["iceberg"].update(catalog={"name": "lake", "properties": {
        "type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}},
        table=table, partitionBy=[])
    spec["schema"] = {"columns": [{"name": "id", "type": "long", "required": True},
                                  {"name": "ts", "type": "timestamp"}, {"name": "region", "type": "string"}],
                      "onIncompatible": "halt"}
    spec["checkpoint"] = {"location": f"file://{tmp_path}/checkpoint"}
    return spec


def bigquery_spec(bootstrap: str, topic: str, tmp_path: Path, bigquery: Any, **overrides: Any) -> dict[str, Any]:
    """iceberg_spec's handoff into a table `orders` of a dataset of its own in the test bed's BigQuery emulator."""
    spec = iceberg_spec(bootstrap, topic, tmp_path, "unused.orders", **overrides)
    spec["sink"] = {"bigquery": {"project": bigquery.project, "dataset": f"drill_{uuid.uuid4().hex[:8]}",
                                 "table": "orders", "partitionBy": "ts", "restEndpoint": bigquery.rest_endpoint,
                                 "grpcEndpoint": bigquery.grpc_endpoint}}
    return spec


def bigquery_rows(cfg: AppConfig) -> list[tuple[int, int, int, str]]:
    """(partition, offset, id, region) of every row of the handoff's BigQuery table, sorted."""
    from handoff_spark.bigquery import client as bigquery_client

    client = bigquery_client.rest_client(cfg.sink)  # type: ignore[arg-type]
    sql = (f"SELECT _kafka_partition AS p, _kafka_offset AS o, id, region "
           f"FROM `{bigquery_client.table_ref(cfg.sink)}`")  # type: ignore[arg-type]
    return sorted((int(r["p"]), int(r["o"]), int(r["id"]), r["region"])
                  for r in client.query(sql, retry=None).result())


def committed_to(cfg: AppConfig, topic: str, ends: dict[int, int]) -> bool:
    """Has the table's ledger reached `ends` on every partition of `topic`? (Iceberg or BigQuery.)"""
    if cfg.sink.kind == "bigquery":
        from handoff_spark.bigquery import ledger as bigquery_ledger

        time.sleep(1.0)   # the emulator serves the driver's writes too: ask once a second, not every 0.2 s
        try:
            at = bigquery_ledger.resume_offsets(cfg.sink, cfg.handoff_id).get(topic, {})  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - not created yet
            return False
        return all(at.get(p, 0) >= e for p, e in ends.items())
    from handoff_spark.iceberg import ledger

    sink = cfg.sink
    try:
        table = ledger.load_table(sink.catalog_name, dict(sink.catalog_properties), sink.table)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - not created yet
        return False
    at = ledger.resume_offsets(table, handoff_id=cfg.handoff_id).get(topic, {})
    return all(at.get(p, 0) >= e for p, e in ends.items())


class Kubelet:
    """Runs the driver Deployment as a local process: the rendered app config, Spark in local mode.

    `publish`: the driver gets the progress ConfigMap's environment, as the operator renders it into the pod, so it
    publishes its progress there and obeys the operator's query hold (`handoff_spark.driver.hold`) and query config
    (`handoff_spark.driver.query_config`). It also gets its pod template's config hash, as the downward API gives
    it, and a new template replaces the process (the Deployment's Recreate rollout): `templates` counts them.

    `pod_name`: the driver also gets the name of the API server's driver pod of its template (the test bed's pods
    merely exist), as the downward API gives it, so the operator takes its published record for that pod's: the
    config it runs and one it refused (`handoff_operator.conditions.with_report`)."""

    def __init__(self, cluster: Cluster, ns: str, name: str, workdir: Path, *, publish: bool = False,
                 env: dict[str, str] | None = None, pod_name: bool = False) -> None:
        self.cluster, self.ns, self.name, self.workdir, self.publish = cluster, ns, name, workdir, publish
        self.pod_name = pod_name
        self.env = env or {}
        self.template_hash: str | None = None  # the running process's pod template (its config-hash annotation)
        self.restart_with: AppConfig | None = None  # the app config the next start mounts instead of the rendered one
        self.templates: list[str | None] = []  # every template a process was started from, in order
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.crashed: list[int] = []     # start indices of processes that exited by themselves
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def config(self) -> AppConfig:
        cm = self.cluster.core.read_namespaced_config_map(f"{self.name}-app", self.ns)
        rendered = AppConfig.model_validate(json.loads(cm.data["app.json"]))
        return rendered.model_copy(update={"spark_conf": {"spark.master": "local[2]",
                                                          "spark.sql.shuffle.partitions": "2"},
                                           "progress_file": None, "metrics_port": None})

    def _start(self) -> None:
        path = self.workdir / "app.json"
        path.write_text((self.restart_with or self.config()).to_json())
        self.restart_with = None
        log = (self.workdir / f"driver-{self.starts}.log").open("w")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "spark_app"), str(REPO / "hack")]),
               "PYSPARK_PYTHON": PY, "PYSPARK_DRIVER_PYTHON": PY}
        if self.publish:
            env.update(HANDOFF_PROGRESS_CONFIGMAP=f"{self.name}-progress", HANDOFF_PROGRESS_NAMESPACE=self.ns,
                       HANDOFF_PROGRESS_PUBLISH_SECONDS="2", KUBECONFIG=self.cluster.kubeconfig)
            if self.template_hash:
                env["HANDOFF_POD_CONFIG_HASH"] = self.template_hash
            if self.pod_name:
                env["HANDOFF_DRIVER_POD_NAME"] = self._pod_of_template()
        self.templates.append(self.template_hash)
        env.update(self.env)
        self.proc = subprocess.Popen([PY, "-m", "handoff_spark", "run", "--config", str(path)], stdout=log,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=self.workdir)
        self.starts += 1

    def _pod_of_template(self) -> str:
        """The name of the API server's driver pod of the running template (the Deployment's, made by its
        ReplicaSet)."""
        return eventually(lambda: next((p.metadata.name for p in self.cluster.driver_pods(self.ns, self.name)
                                        if (p.metadata.annotations or {}).get("handoff.io/config-hash")
                                        == self.template_hash), None), "the driver pod of the template", timeout=60)

    def crash(self, restart_with: AppConfig | None = None) -> None:
        """kill -9 the driver, as a crash: the loop starts it again (from `restart_with` when given: a pod whose
        mounted app.json is older than what the operator rendered since, as the kubelet refreshes such a volume
        only after a while)."""
        proc = self.proc
        assert proc is not None
        self.restart_with = restart_with
        kill_tree(proc.pid)  # every process of the driver, as a pod dies

    def logs(self) -> str:
        """Every driver process's output so far, in start order."""
        return "".join((self.workdir / f"driver-{i}.log").read_text(errors="replace") for i in range(self.starts))

    def crashes(self) -> str:
        """The end of each crashed process's log: what an assertion on `starts` shows when a driver died."""
        return "\n".join(f"driver-{i}.log (exited by itself):\n"
                         + (self.workdir / f"driver-{i}.log").read_text(errors="replace")[-3000:]
                         for i in self.crashed)

    def _terminate(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGTERM)   # the app finishes its micro-batch and exits
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                deployment = self.cluster.apps.read_namespaced_deployment(f"{self.name}-driver", self.ns)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                replicas, template = 0, None      # not created yet
            else:
                replicas = deployment.spec.replicas
                template = (deployment.spec.template.metadata.annotations or {}).get("handoff.io/config-hash")
            if replicas and self.proc is not None and template != self.template_hash:
                self._terminate()                 # a new pod template: Recreate
            if replicas and self.proc is None:
                self.template_hash = template
                self._start()
            elif not replicas and self.proc is not None:
                self._terminate()
            elif self.proc is not None and self.proc.poll() is not None:
                self.crashed.append(self.starts - 1)
                self.proc = None          # crashed: restart it, as the kubelet would
            time.sleep(0.5)
        if self.proc is not None:
            self._terminate()

    def __enter__(self) -> "Kubelet":
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        self.thread.join(180)


@contextlib.contextmanager
def local_handoff(cluster: Cluster, ns: str, spec: dict[str, Any], workdir: Path, bootstrap: str,
                  topic: str, *, pod_name: bool = False) -> Iterator[tuple[Kubelet, AppConfig]]:
    """The operator (in-process, against the test bed's API server) and a local driver (`Kubelet`, publishing; with
    its pod's name when `pod_name`) for the handoff `orders` of `spec`, yielded once what `topic` held at the start
    is committed; stopped after."""
    op = Operator(cluster.kubeconfig, status_interval=1.0, delete_grace_seconds=5.0)
    op.start()
    try:
        cluster.create(ns, "orders", spec)
        with Kubelet(cluster, ns, "orders", workdir, publish=True, pod_name=pod_name) as kubelet:
            cfg = eventually(lambda: kubelet.config(), "the rendered app config")
            ends = end_offsets(bootstrap, topic)
            eventually(lambda: committed_to(cfg, topic, ends), "the records produced so far committed", timeout=300)
            yield kubelet, cfg
    finally:
        op.stop()
