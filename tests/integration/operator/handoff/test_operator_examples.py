"""The "done" check of the operator, as a user does it: `kubectl apply -f crds/`, `kubectl apply -f
examples/prerequisites/` (namespaces and the Secrets the
examples reference), `kubectl apply -f examples/`, `handoff operator` as a separate process with its
settings from the environment → every example handoff gets its children and a status that
`kubectl wait --for=condition=Progressing` uses; the operator's Prometheus endpoint counts reconciles."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from kubernetes import client

from handoff_testbed.proc import free_port
from operator_support import REPO, Cluster, eventually, kubectl

pytestmark = pytest.mark.apiserver

def _handoffs() -> list[tuple[str, str]]:
    out = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "StreamTableHandoff":
                out.append((doc["metadata"]["namespace"], doc["metadata"]["name"]))
    return out


@pytest.fixture
def handoff_operator(cluster: Cluster, tmp_path: Path) -> Iterator[int]:
    port = free_port()
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "HANDOFF_METRICS_PORT": str(port),
           "HANDOFF_STATUS_INTERVAL": "2", "HANDOFF_LOG_LEVEL": "INFO"}
    log = open(tmp_path / "operator.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "handoff_operator", "operator"], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def test_examples_get_children_and_a_waitable_status(cluster: Cluster, handoff_operator: int) -> None:
    handoffs = _handoffs()
    assert handoffs, "examples/ has StreamTableHandoffs"
    # What a user applies first: the examples' namespaces and the Secrets they reference.
    pre = kubectl(cluster.kubeconfig, "apply", "-f", str(REPO / "examples" / "prerequisites"), check=False)
    assert pre.returncode == 0, pre.stderr
    out = kubectl(cluster.kubeconfig, "apply", "-f", str(REPO / "examples"), check=False)
    assert out.returncode == 0, out.stderr
    try:
        for ns, name in handoffs:
            eventually(lambda: cluster.apps.read_namespaced_deployment(f"{name}-driver", ns), f"{ns}/{name} driver",
                       timeout=90)
            children = cluster.children(ns, name)
            for kind in ("ServiceAccount", "Role", "RoleBinding"):
                assert len(children[kind]) == 1, (ns, name, kind)
            assert sorted(c.metadata.name for c in children["Service"]) == [f"{name}-driver", f"{name}-ui"]
            # <name>-timeline comes with the first entry the operator owes the handoff's record (handoff.journal).
            assert sorted(c.metadata.name for c in children["ConfigMap"]
                          if c.metadata.name != f"{name}-timeline") == [f"{name}-app", f"{name}-progress"]
            if name == "orders-to-iceberg":  # its Kafka/S3 credentials come from Secrets
                assert [s.metadata.name for s in children["Secret"]] == [f"{name}-app"]
                # Its spec.spark.ui.ingress: the Ingress to the UI Service.
                ingress = eventually(lambda: client.NetworkingV1Api(cluster.api).read_namespaced_ingress(
                    f"{name}-ui", ns), f"{ns}/{name} UI Ingress")
                assert ingress.spec.rules[0].host == "orders-ui.spark.example.com"
                assert ingress.spec.rules[0].http.paths[0].backend.service.name == f"{name}-ui"
            waited = kubectl(cluster.kubeconfig, "wait", "-n", ns, "--for=condition=Progressing",
                             "--timeout=90s", f"sth/{name}", check=False)
            assert waited.returncode == 0 and "condition met" in waited.stdout, waited.stderr
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{handoff_operator}/metrics", timeout=10).read().decode()
        assert 'handoff_reconciles_total{result="ok"}' in metrics
        assert "handoff_reconcile_duration_seconds_bucket" in metrics
        assert 'handoff_handoffs{phase="Starting"}' in metrics
    finally:
        for ns, name in handoffs:
            kubectl(cluster.kubeconfig, "delete", "-n", ns, f"sth/{name}", "--wait=true", "--timeout=90s",
                    check=False)


def test_watched_namespaces_limit_the_operator(cluster: Cluster) -> None:
    """HANDOFF_NAMESPACES: handoffs elsewhere are left alone (no finalizer, no children, no status)."""
    from operator_support import Operator, base_spec

    watched, other = cluster.new_namespace("watched"), cluster.new_namespace("other")
    op = Operator(cluster.kubeconfig, namespaces=[watched], status_interval=1.0)
    op.start()
    try:
        cluster.create(other, "ignored", base_spec())
        cluster.create(watched, "managed", base_spec())
        eventually(lambda: cluster.children(watched, "managed")["Deployment"], "managed handoff's Deployment")
        cluster.wait_condition(watched, "managed", "Progressing", "True")
        ignored = cluster.get(other, "ignored")
        assert not ignored.get("status") and not ignored["metadata"].get("finalizers")
        assert not cluster.children(other, "ignored")["Deployment"]
        cluster.delete_all_handoffs()
    finally:
        op.stop()
