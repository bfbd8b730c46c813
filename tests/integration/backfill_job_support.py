"""How the operator tests run a Backfill ReplayRequest's Job, for either sink.

The test bed's kube-controller-manager runs the Job controller; kwok stands in for the kubelet, and its
pod-complete stage ends a Job's Running pod Succeeded at once, without running anything: the operator then
sees a succeeded Job whose range is not in the table (BackfillIncomplete), which is why success needs the
ledger too. So a ResourceQuota keeps the Job's pod from being created while the test runs the Job's own
command as a local process (the real app, Spark local mode, against the test's Kafka and table), as the kubelet
would run it; then the quota goes and the Job controller and kwok finish the Job.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from operator_support import REPO, Cluster, eventually


def hold_pods(cluster: Cluster, ns: str) -> None:
    """No new pod in `ns` (the driver's is already there): the Job stays active, podless."""
    cluster.core.create_namespaced_resource_quota(ns, {"metadata": {"name": "hold-pods"},
                                                       "spec": {"hard": {"pods": "1"}}})


def job_of(cluster: Cluster, ns: str, request: str) -> Any:
    """The Job of ReplayRequest `request` (None: none), never more than one."""
    jobs = client.BatchV1Api(cluster.api).list_namespaced_job(
        ns, label_selector=f"handoff.io/replay-request={request}").items
    assert len(jobs) <= 1, [j.metadata.name for j in jobs]
    return jobs[0] if jobs else None


def run_job_command(cluster: Cluster, ns: str, job: Any, tmp_path: Path, handoff: str = "orders") -> None:
    """The Job's container command, run here: the app config the operator rendered (Spark local mode instead
    of the pod's, no progress file), its own checkpoint directory."""
    from handoff_spark.config import AppConfig

    (container,) = job.spec.template.spec.containers
    command = list(container.command)
    rendered = json.loads(cluster.core.read_namespaced_config_map(f"{handoff}-app", ns).data["app.json"])
    cfg = AppConfig.model_validate(rendered).model_copy(update={
        "spark_conf": {"spark.master": "local[2]", "spark.sql.shuffle.partitions": "2"},
        "progress_file": None, "metrics_port": None})
    (tmp_path / "app.json").write_text(cfg.to_json())
    assert command[:4] == ["python", "-m", "handoff_spark", "backfill"]
    command[0] = sys.executable
    command[command.index("--config") + 1] = str(tmp_path / "app.json")
    command[command.index("--checkpoint") + 1] = str(tmp_path / "backfill-checkpoint")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "spark_app"), str(REPO / "hack")]),
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    # A failed run is run again, as the Job controller would start a new pod (restartPolicy Never), up to
    # backoffLimit + 1 runs; each resumes from the ledger of its query (on this shared machine Spark's Python
    # worker can miss its 10 s connect-back under load).
    for attempt in range(job.spec.backoff_limit + 1):
        log = tmp_path / f"backfill-{attempt}.log"
        with log.open("w") as out:
            rc = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=900,
                                cwd=tmp_path).returncode
        if rc == 0:
            return
    raise AssertionError(f"the backfill failed {attempt + 1} times; the last run's log:\n{log.read_text()[-4000:]}")


def let_the_job_pod_finish(cluster: Cluster, ns: str, request: str) -> None:
    """Lift the quota; the Job controller creates the pod; it ends Succeeded (exit 0), as the process did (kwok's
    pod-complete stage; written here only if kwok has not done it yet)."""
    cluster.core.delete_namespaced_resource_quota("hold-pods", ns)
    job = job_of(cluster, ns, request)

    def job_pod() -> Any:
        # A Job update makes the Job controller sync it now, not after the back-off its refused pod creations
        # built up (nothing tells it a quota went away).
        client.BatchV1Api(cluster.api).patch_namespaced_job(job.metadata.name, ns, {"metadata": {"annotations": {
            "test.handoff.io/poke": str(time.monotonic())}}})
        return next(iter(cluster.core.list_namespaced_pod(
            ns, label_selector=f"handoff.io/replay-request={request}").items), None)
    pod = eventually(job_pod, "the Job's pod", 120)
    if pod.status.phase not in ("Succeeded", "Failed"):
        cluster.core.patch_namespaced_pod_status(pod.metadata.name, ns, {"status": {
            "phase": "Succeeded", "containerStatuses": [{
                "name": "backfill", "image": pod.spec.containers[0].image, "imageID": "", "ready": False,
                "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}})
