"""A Backfill ReplayRequest's Job (built from the driver Deployment) and its run policy (pure)."""
from __future__ import annotations

import json

from handoff_operator.spec.render import CHECKPOINT_DIR, CONFIG_FILE, render, selector_labels
from handoff_operator.replay.backfill import (BACKOFF_LIMIT, CHECKPOINT_MOUNT, JobState, backfill_job, job_name,
                                              job_state, next_step)
from handoff_operator.spec.validation import check, parse_spec

from operator_spec_support import SECRETS, body, spec

REQUEST = {"metadata": {"name": "fill-june", "namespace": "shop", "uid": "req-uid"}}
FROM, TO = {"orders": {"0": 50, "1": 25}}, {"orders": {"0": 60, "1": 60}}


def _deployment(spec_dict=None) -> dict:
    b = body(spec_dict)
    parsed, problems = parse_spec(b["spec"])
    assert not problems
    resolved, problems = check("orders", parsed, SECRETS)
    assert not problems
    return render(b, parsed, "default/image:1", resolved).child("Deployment")


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value") for e in container["env"]}


def test_the_job_runs_the_backfill_with_the_drivers_pod_and_its_own_query_and_checkpoint() -> None:
    deployment = _deployment()
    job = backfill_job(deployment, REQUEST, "orders", FROM, TO)
    pod = job["spec"]["template"]["spec"]
    driver_pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (driver,) = driver_pod["containers"]
    assert container["command"] == [
        "python", "-m", "handoff_spark", "backfill", "--config", CONFIG_FILE, "--query", "backfill-fill-june",
        "--from", json.dumps(FROM), "--to", json.dumps(TO), "--checkpoint", CHECKPOINT_MOUNT]
    # What the stream runs: image, service account, resources, the app config volume.
    assert container["image"] == driver["image"] and container["resources"] == driver["resources"]
    assert pod["serviceAccountName"] == driver_pod["serviceAccountName"]
    config_volume = next(v for v in driver_pod["volumes"] if v["name"] == "app-config")
    assert config_volume in pod["volumes"]
    assert {"name": "app-config", "mountPath": "/etc/handoff", "readOnly": True} in container["volumeMounts"]
    # Its own checkpoint (an emptyDir), never the stream's checkpoint PVC.
    assert not any(m["mountPath"] == CHECKPOINT_DIR for m in container["volumeMounts"])
    assert not any("persistentVolumeClaim" in v for v in pod["volumes"])
    assert {"name": "backfill-checkpoint", "emptyDir": {}} in pod["volumes"]
    # Spark local mode in the Job's pod; the stream's progress record and scaling are not its business.
    env = _env(container)
    assert env["HANDOFF_SPARK_MASTER"] == "local[*]"
    assert not {"HANDOFF_PROGRESS_CONFIGMAP", "HANDOFF_PROGRESS_NAMESPACE", "HANDOFF_DRIVER_POD_NAME"} & set(env)
    assert env["PYSPARK_SUBMIT_ARGS"] == _env(driver)["PYSPARK_SUBMIT_ARGS"]
    assert "readinessProbe" not in container and "ports" not in container
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == BACKOFF_LIMIT
    # Labelled a backfill: the driver's selector never matches it.
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "backfill" and labels["handoff.io/replay-request"] == "fill-june"
    assert not set(selector_labels("orders").items()) <= set(labels.items())
    assert job["metadata"]["labels"] == labels
    # Owned by the request: deleting it deletes the Job.
    assert job["metadata"]["ownerReferences"] == [{
        "apiVersion": "handoff.io/v1alpha1", "kind": "ReplayRequest", "name": "fill-june", "uid": "req-uid",
        "controller": True, "blockOwnerDeletion": True}]
    assert job["metadata"]["name"] == "fill-june-backfill" and job["metadata"]["namespace"] == "shop"
    # The builder copies: the Deployment it read is unchanged.
    assert deployment == _deployment()


def test_without_a_checkpoint_pvc_the_drivers_other_volumes_are_kept() -> None:
    s = spec()
    s["checkpoint"] = {"location": "file:///mnt/shared/cp"}
    pod = backfill_job(_deployment(s), REQUEST, "orders", FROM, TO)["spec"]["template"]["spec"]
    assert sorted(v["name"] for v in pod["volumes"]) == ["app-config", "backfill-checkpoint", "run"]


def test_job_names_are_dns_labels() -> None:
    assert job_name("a" * 253).endswith("-backfill") and len(job_name("a" * 253)) <= 63
    assert job_name("a" * 253) != job_name("a" * 252)


def _job(conditions: list[dict], owner: str = "req-uid") -> dict:
    return {"metadata": {"name": "fill-june-backfill", "ownerReferences": [{"uid": owner, "controller": True}]},
            "status": {"conditions": conditions}}


def test_job_state_reads_the_jobs_conditions() -> None:
    assert job_state(_job([])) == JobState("fill-june-backfill", "req-uid")
    done = job_state(_job([{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}]))
    assert done.succeeded and not done.failed
    failed = job_state(_job([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                              "message": "Job has reached the specified backoff limit"}]))
    assert failed.failed and failed.failure == "BackoffLimitExceeded: Job has reached the specified backoff limit"
    assert not job_state(_job([{"type": "Failed", "status": "False"}])).failed


def decide(steps, job, reached):
    return next_step(steps, job, reached, "fill-june-backfill", "backfill-fill-june", "req-uid")


def test_the_run_creates_the_job_once_and_adopts_one_it_finds() -> None:
    running = JobState("fill-june-backfill", "req-uid")
    assert decide([], None, False).action == "create"
    # An operator restarted between creating the Job and recording it adopts it: never a second Job.
    adopt = decide([], running, False)
    assert adopt.action == "adopt" and adopt.reason == "JobCreated"
    assert decide(["JobCreated"], running, False).action == "wait"
    # The range may be in the table before the Job has exited: it still waits for the Job.
    assert decide(["JobCreated"], running, True).action == "wait"
    # A Job of an earlier request of the same name (being garbage-collected) is neither adopted nor reused.
    other = decide([], JobState("fill-june-backfill", "old-uid"), False)
    assert other.action == "wait" and "earlier ReplayRequest" in other.message


def test_success_needs_the_job_and_the_ledger() -> None:
    done = JobState("fill-june-backfill", "req-uid", succeeded=True)
    assert decide(["JobCreated"], done, True).action == "succeed"
    incomplete = decide(["JobCreated"], done, False)
    assert incomplete.action == "fail" and incomplete.reason == "BackfillIncomplete"
    # The Job gone (deleted) after the ledger reached the end: the ledger is the proof.
    assert decide(["JobCreated"], None, True).action == "succeed"
    # Gone before: created again, and it resumes from its own ledger entries.
    again = decide(["JobCreated"], None, False)
    assert again.action == "create" and "resumes" in again.message


def test_a_failed_job_fails_the_request_naming_the_jobs_failure() -> None:
    failed = JobState("fill-june-backfill", "req-uid", failed=True, failure="DeadlineExceeded: too slow")
    n = decide(["JobCreated"], failed, False)
    assert n.action == "fail" and n.reason == "BackfillJobFailed"
    assert "DeadlineExceeded: too slow" in n.message and "backfill-fill-june" in n.message
