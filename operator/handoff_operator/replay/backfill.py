"""A Backfill ReplayRequest as a Kubernetes Job (pure; no I/O): the Job's manifest and what to do next.

The backfill runs `python -m handoff_spark backfill` (spark_app/handoff_spark/__main__.py) in a batch/v1 Job
built from the driver Deployment's pod template, so it runs exactly what the stream runs: the same image,
env, volumes (the app config ConfigMap or Secret), service account and resources. What differs, and why:
- its own ledger query `backfill-<request>`: its commits never move the stream's position, and a rerun of
  the same request resumes from its own ledger entries (the sink refuses offsets the table already holds);
- its own checkpoint in an emptyDir, never the stream's checkpoint volume (a ReadWriteOnce PVC the running
  driver holds); the checkpoint is only a cache, the ledger is the truth;
- Spark in local mode inside the Job's pod (`local[*]`: the driver pod's cores): a bounded range needs no
  executor pods, and executor pods named and labelled as the stream's would be counted and scaled as the
  stream's;
- labels `app.kubernetes.io/component: backfill`, never the driver's selector labels, so the Deployment,
  the driver Service and the operator's driver/progress logic never pick its pod up; no progress-ConfigMap
  env (that record belongs to the stream's driver);
- ownerReference to the ReplayRequest: deleting the request deletes the Job (and its pod).

`next_step` is the whole run policy over the request's recorded steps, the Job's state and the ledger.
"""
from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from handoff_spark import contract

from handoff_operator.spec.render import CHECKPOINT_DIR, COMPONENT_LABEL, CONFIG_FILE, GROUP, MANAGED_BY, NAME_LABEL, VERSION

BACKFILL_COMPONENT = "backfill"
REQUEST_LABEL = "handoff.io/replay-request"
CHECKPOINT_MOUNT = "/var/lib/handoff/backfill-checkpoint"
#: Pod failures before the Job is failed: a crash or an evicted pod is retried (the run resumes from its own
#: ledger entries), a backfill that cannot work ends after a few tries instead of looping.
BACKOFF_LIMIT = 3
JOB_CREATED, BACKFILLED = "JobCreated", "Backfilled"


def backfill_query(request: str) -> str:
    """The ledger query of a backfill request (AppConfig.query_name of its run)."""
    return f"backfill-{request}"


def job_name(request: str) -> str:
    """`<request>-backfill`, a DNS label (its pods carry it as the label batch.kubernetes.io/job-name)."""
    name = f"{request}-backfill"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(request.encode()).hexdigest()[:8]
    return f"{request[:63 - len('-backfill') - 9].rstrip('-.')}-{digest}-backfill"


def command(request: str, start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]]) -> list[str]:
    """The container command: the app's backfill entry point over the mounted app config."""
    return contract.backfill_command("python", CONFIG_FILE, backfill_query(request), start, end, CHECKPOINT_MOUNT)


def owner_reference(request: Mapping[str, Any]) -> dict[str, Any]:
    meta = request["metadata"]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ReplayRequest", "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def backfill_job(deployment: Mapping[str, Any], request: Mapping[str, Any], handoff: str,
                 start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """The Job of Backfill request `request` (its object: name, namespace, uid) from the driver Deployment of
    handoff `handoff` (as the API returns it, camelCase). `start`/`end`: offsets as the CRD stores them."""
    meta = request["metadata"]
    name = meta["name"]
    labels = {**MANAGED_BY, NAME_LABEL: handoff, COMPONENT_LABEL: BACKFILL_COMPONENT, REQUEST_LABEL: name}
    pod = copy.deepcopy(dict(deployment["spec"]["template"]["spec"]))
    driver = next(c for c in pod["containers"] if c["name"] == "driver")
    container: dict[str, Any] = {k: v for k, v in driver.items()
                                 if k not in ("ports", "readinessProbe", "livenessProbe", "startupProbe")}
    container["name"] = "backfill"
    container["command"] = command(name, start, end)
    container.pop("args", None)
    # The stream's driver publishes its progress record and is scaled; the backfill does neither.
    env = [e for e in driver.get("env") or [] if e["name"] not in contract.STREAM_DRIVER_ONLY_ENV]
    for e in env:
        if e["name"] == contract.ENV_SPARK_MASTER:
            e.clear()
            e.update(name=contract.ENV_SPARK_MASTER, value="local[*]")
    container["env"] = env
    mounts = [m for m in driver.get("volumeMounts") or [] if m["mountPath"] != CHECKPOINT_DIR]
    container["volumeMounts"] = mounts + [{"name": "backfill-checkpoint", "mountPath": CHECKPOINT_MOUNT}]
    kept = {m["name"] for m in mounts}
    pod["volumes"] = [v for v in pod.get("volumes") or [] if v["name"] in kept] + [
        {"name": "backfill-checkpoint", "emptyDir": {}}]
    pod["containers"] = [container]
    pod["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job_name(name), "namespace": meta["namespace"], "labels": labels,
                     "ownerReferences": [owner_reference(request)]},
        "spec": {"backoffLimit": BACKOFF_LIMIT,
                 "template": {"metadata": {"labels": labels}, "spec": pod}},
    }


# ------------------------------------------------------------------------------------------ run policy

@dataclass(frozen=True)
class JobState:
    """What the Job's status says (batch/v1 conditions Complete / Failed)."""

    name: str
    owner_uid: str = ""                     # uid of the ReplayRequest that owns it (its controller reference)
    succeeded: bool = False
    failed: bool = False
    failure: str = ""                       # the Failed condition's reason: message


def job_state(job: Mapping[str, Any]) -> JobState:
    """A Job object (camelCase, as the API returns it) reduced to what the run policy reads."""
    status = job.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    failed = conditions.get("Failed")
    failure = (f"{failed.get('reason') or 'Failed'}: {failed.get('message') or ''}".rstrip(": ")
               if failed is not None else "")
    owner = next((r.get("uid", "") for r in job["metadata"].get("ownerReferences") or [] if r.get("controller")), "")
    return JobState(job["metadata"]["name"], owner,
                    succeeded="Complete" in conditions, failed=failed is not None, failure=failure)


Action = Literal["create", "adopt", "wait", "succeed", "fail"]


@dataclass(frozen=True)
class Next:
    action: Action
    reason: str = ""
    message: str = ""


def next_step(steps: Sequence[str], job: JobState | None, reached: bool, job_name_: str, query: str,
              request_uid: str) -> Next:
    """What a running Backfill request does now, from its recorded steps, its Job (None: no such Job) and
    whether the ledger of its query has reached `to` in every partition.

    Idempotent by construction: a Job that exists is adopted, never created twice (an operator restarted
    between creating the Job and recording the step finds it by name); the request succeeds only when the
    Job succeeded *and* the table's ledger vouches for the whole range (the Job's exit code alone is no
    proof that the records are in the table)."""
    created = JOB_CREATED in steps
    if job is None:
        if created and reached:
            return Next("succeed", "Succeeded", f"the ledger of query {query} reached the end of the range "
                                                f"(Job {job_name_} is gone)")
        return Next("create", JOB_CREATED,
                    f"created Job {job_name_}" if not created else
                    f"Job {job_name_} was deleted before the range was in the table: created it again (it resumes "
                    f"from the ledger of query {query})")
    if job.owner_uid != request_uid:
        return Next("wait", message=f"Job {job_name_} belongs to an earlier ReplayRequest of this name; waiting "
                                    f"for Kubernetes to delete it with its owner")
    if not created:
        return Next("adopt", JOB_CREATED, f"Job {job_name_} exists already (created before an operator restart): "
                                          f"adopted it")
    if job.failed:
        return Next("fail", "BackfillJobFailed", f"Job {job_name_} failed ({job.failure or 'no reason given'}); "
                    f"see `kubectl logs job/{job_name_}`. What it committed stays in the table under ledger "
                    f"query {query}: fix the cause, then create a new Backfill request for the offsets still "
                    f"missing (status.progress.offsets says how far it got)")
    if job.succeeded:
        if reached:
            return Next("succeed", "Succeeded", f"Job {job_name_} succeeded and the ledger of query {query} "
                                                f"reached the end of the range")
        return Next("fail", "BackfillIncomplete", f"Job {job_name_} succeeded, but the table's ledger of query "
                    f"{query} does not reach the end of the range (status.progress.offsets); create a new "
                    f"Backfill request for the offsets still missing")
    return Next("wait")

