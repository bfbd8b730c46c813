"""What the status refresh reads instead of per-handoff API calls (issue 16): the driver's facts from JSON bodies
(a GET or kopf's watch), the slimmed index entries, the views read through the event loop, and the rendering
kept per spec (rendering.prepare)."""
from __future__ import annotations

import asyncio
import copy
import gc
import time
import warnings

import pytest
from kubernetes import client

from handoff_operator.runtime import state
from handoff_operator.spec import rendered as rendering
from handoff_operator.runtime.kube import Kube, driver_facts, executors_running
from handoff_operator.spec.render import CONFIG_HASH_ANNOTATION, REPLAY_HOLD_ANNOTATION
from handoff_operator.truth.watched import Seen, Views, _slim_deployment, _slim_pod, last_change
from operator_support import base_spec  # in tests/integration, which pyproject.toml puts on the path

DEPLOYMENT = {"metadata": {"name": "orders-driver", "generation": 3, "labels": {"x": "y"}},
              "spec": {"replicas": 1, "template": {"spec": {"containers": []}}},
              "status": {"observedGeneration": 2, "readyReplicas": 1, "updatedReplicas": 1, "replicas": 1}}


def pod(name: str, created: str, *, deleting: bool = False, phase: str = "Running") -> dict:
    return {"metadata": {"name": name, "creationTimestamp": created, "uid": "u-" + name,
                         "deletionTimestamp": "2026-01-01T00:09:00Z" if deleting else None,
                         "annotations": {CONFIG_HASH_ANNOTATION: "h-" + name, "other": "x"}},
            "spec": {"containers": [{"name": "driver", "image": "i"}]},
            "status": {"phase": phase, "startTime": "2026-01-01T00:00:10Z",
                       "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "t"}],
                       "containerStatuses": [
                           {"name": "driver", "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                            "lastState": {"terminated": {"reason": "Error", "exitCode": 3, "message": "boom"}}},
                           {"name": "sidecar", "restartCount": 9}]}}


def test_driver_facts_from_json_bodies_newest_live_pod_speaks() -> None:
    pods = [pod("d-old", "2026-01-01T00:00:00Z"), pod("d-new", "2026-01-01T00:05:00Z"),
            pod("d-going", "2026-01-01T00:08:00Z", deleting=True)]
    facts = driver_facts(DEPLOYMENT, pods)
    assert (facts.desired_replicas, facts.replicas, facts.ready_replicas, facts.rollout_observed) == (1, 3, 1, False)
    assert (facts.pod_name, facts.pod_phase, facts.pod_ready, facts.pod_config_hash) == \
        ("d-new", "Running", True, "h-d-new")
    assert facts.pod_started_at_ms == 1767225610000
    assert (facts.restart_count, facts.waiting_reason) == (2, "CrashLoopBackOff")
    assert (facts.last_termination_reason, facts.last_termination_message) == ("Error (exit code 3)", "boom")


def test_slimmed_index_entries_give_the_same_facts() -> None:
    pods = [pod("d-old", "2026-01-01T00:00:00Z"), pod("d-new", "2026-01-01T00:05:00Z")]
    assert driver_facts(_slim_deployment(DEPLOYMENT), [_slim_pod(p) for p in pods]) == driver_facts(DEPLOYMENT, pods)
    assert "spec" not in _slim_pod(pods[0]) and "other" not in _slim_pod(pods[0])["metadata"]["annotations"]


def test_executors_running_leaves_out_pending_and_deleted_pods() -> None:
    pods = [pod("e-1", "t"), pod("e-2", "t", phase="Pending"), pod("e-3", "t", deleting=True), pod("e-4", "t")]
    assert executors_running(pods) == 2 and executors_running([_slim_pod(p) for p in pods]) == 2


def test_views_are_read_in_the_event_loop_and_handed_to_a_thread_as_plain_data() -> None:
    indexes = {
        "handoff_driver_deployments": {("ns", "orders"): [_slim_deployment(DEPLOYMENT)]},
        "handoff_pods": {("ns", "orders", "driver"): [_slim_pod(pod("d-1", "2026-01-01T00:00:00Z"))],
                         ("ns", "orders", "executor"): [_slim_pod(pod("e-1", "t")), _slim_pod(pod("e-2", "t"))]},
        "handoff_progress_records": {("ns", "orders"): ['{"publishedAtMs": 5}']},
        "handoff_bodies": {("ns", "orders"): [{"metadata": {"name": "orders", "resourceVersion": "7"}}]},
    }

    async def main() -> tuple:
        views = Views.from_kwargs({**indexes, "unrelated": 1})
        assert views is not None and Views.from_kwargs({"handoff_pods": {}}) is None
        return await asyncio.gather(asyncio.to_thread(views.seen, "ns", "orders"),
                                    asyncio.to_thread(views.seen, "ns", "refunds"))

    async def handoffs() -> tuple:
        views = Views.from_kwargs(indexes)
        assert views is not None
        return views.handoff("ns", "orders"), views.handoff("ns", "refunds")

    assert asyncio.run(handoffs()) == ({"metadata": {"name": "orders", "resourceVersion": "7"}}, None)
    orders, refunds = asyncio.run(main())
    assert orders.driver().pod_name == "d-1" and orders.executors_running() == 2
    assert orders.progress_record == '{"publishedAtMs": 5}'
    assert refunds.driver() is None and refunds.executors_running() == 0 and refunds.progress_record is None


def test_a_view_read_after_the_event_loop_closed_fails_at_once_without_a_stray_coroutine() -> None:
    loop = asyncio.new_event_loop()
    views = Views(loop, {"handoff_driver_deployments": {}, "handoff_pods": {}, "handoff_progress_records": {}})
    loop.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="closed"):
            views.seen("ns", "orders")
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]


def handoff(spec: dict, uid: str = "u1", annotations: dict | None = None) -> dict:
    return {"apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
            "metadata": {"name": "orders", "namespace": "ns", "uid": uid, "generation": 1,
                         "annotations": annotations or {}}, "spec": spec}


def test_rendering_is_kept_per_spec_and_redone_when_an_input_changes() -> None:
    kube = Kube(client.ApiClient())  # a spec naming no Secret makes no request
    spec = base_spec("127.0.0.1:9092")
    state.forget("ns", "orders")
    first = rendering.prepare(kube, handoff(spec), "img:1")
    assert first.rendered is not None and not first.problems
    assert len(first.digests) == len(first.rendered.children)
    assert rendering.prepare(kube, handoff(copy.deepcopy(spec)), "img:1") is first

    changed = rendering.prepare(kube, handoff({**spec, "commitInterval": "30s"}), "img:1")
    assert changed is not first and changed.rendered.config_hash != first.rendered.config_hash
    held = rendering.prepare(kube, handoff({**spec, "commitInterval": "30s"},
                                           annotations={REPLAY_HOLD_ANNOTATION: "r"}), "img:1")
    assert held.rendered.child("Deployment")["spec"]["replicas"] == 0
    assert rendering.prepare(kube, handoff(spec), "img:2").rendered.config.spark_conf != \
        first.rendered.config.spark_conf
    assert rendering.prepare(kube, handoff(spec, uid="u2"), "img:1").rendered.child("Deployment")[
        "metadata"]["ownerReferences"][0]["uid"] == "u2"


def test_an_invalid_spec_keeps_its_problems_from_the_cache() -> None:
    kube = Kube(client.ApiClient())
    state.forget("ns", "orders")
    bad = {**base_spec(), "commitInterval": "soon"}
    first = rendering.prepare(kube, handoff(bad), "img")
    assert first.spec is None and first.rendered is None and first.problems
    again = rendering.prepare(kube, handoff(bad, uid="u2"), "img")
    assert again.problems == first.problems and again.rendered is None


def test_only_a_settled_driver_is_taken_from_the_index() -> None:
    settled = {**DEPLOYMENT, "status": {**DEPLOYMENT["status"], "observedGeneration": 3}}
    running = pod("d-1", "2026-01-01T00:00:00Z")
    running["status"]["containerStatuses"][0]["state"] = {"running": {}}
    fine = Seen(_slim_deployment(settled), [_slim_pod(running)])
    assert fine.settled_driver() == fine.driver() and fine.driver().pod_ready
    assert Seen(_slim_deployment(DEPLOYMENT), [_slim_pod(running)]).settled_driver() is None  # rollout not observed
    assert Seen(_slim_deployment(settled), [_slim_pod(pod("d-1", "t"))]).settled_driver() is None  # crash looping
    starting = copy.deepcopy(running)
    starting["status"]["conditions"][0]["status"] = "False"
    assert Seen(_slim_deployment(settled), [_slim_pod(starting)]).settled_driver() is None
    assert Seen(None).settled_driver() is None


def test_an_unsettled_driver_is_taken_from_the_index_once_its_objects_were_quiet() -> None:
    from handoff_operator.truth.watched import QUIET_SECONDS, quiet

    settled = {**DEPLOYMENT, "status": {**DEPLOYMENT["status"], "observedGeneration": 3}}
    unready = pod("d-1", "2026-01-01T00:00:00Z")
    unready["status"]["containerStatuses"][0]["state"] = {"running": {}}
    unready["status"]["conditions"][0]["status"] = "False"  # e.g. its node went NotReady
    loud = Seen(_slim_deployment(settled), [_slim_pod(unready)])
    assert loud.settled_driver() is None
    still = Seen(_slim_deployment(settled), [_slim_pod(unready)], quiet=True)
    assert still.settled_driver() == still.driver() and not still.driver().pod_ready
    assert Seen(None, quiet=True).settled_driver() is None  # no Deployment in the index: read the API server
    assert quiet(100.0, 100.0 + QUIET_SECONDS) and not quiet(100.0, 100.0 + QUIET_SECONDS - 1)
    assert not quiet(None, 1e9)


def test_a_handoffs_last_child_event_is_kept_in_its_childrens_index_entries() -> None:
    """So it goes with them when kopf drops a deleted object's entries: nothing is kept for a deleted handoff."""
    from handoff_operator.truth.watched import CHANGED_AT, QUIET_SECONDS, handoff_driver_deployments, handoff_pods

    before = time.monotonic()
    (deployment,) = asyncio.run(handoff_driver_deployments(
        namespace="ns", labels={"handoff.io/name": "orders"}, body=DEPLOYMENT)).values()
    (driver,) = asyncio.run(handoff_pods(namespace="ns", labels={"handoff.io/name": "orders",
                                                                  "app.kubernetes.io/component": "driver"},
                                         body=pod("d-1", "t"))).values()
    assert before <= deployment[CHANGED_AT] <= driver[CHANGED_AT]
    assert last_change([deployment, None, driver]) == driver[CHANGED_AT] and last_change([None]) is None
    indexes = {"handoff_driver_deployments": {("ns", "orders"): [deployment]},
               "handoff_pods": {("ns", "orders", "driver"): [driver]},
               "handoff_progress_records": {}, "handoff_bodies": {}}
    views = Views(asyncio.new_event_loop(), indexes)
    assert not views._read("ns", "orders").quiet
    driver[CHANGED_AT] = deployment[CHANGED_AT] = before - QUIET_SECONDS
    assert views._read("ns", "orders").quiet and not views._read("ns", "gone").quiet
    views.loop.close()


def test_a_deployment_event_of_our_own_apply_is_not_drift_but_somebody_elses_edit_is() -> None:
    """on_driver_deployment forgets an applied Deployment (apply it again) when its spec changed: not when the
    generation is the one our own apply produced (at creation that re-applied every Deployment twice more)."""
    from handoff_operator.runtime.kube import AppliedChildren

    applied = AppliedChildren(resync=600)
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"namespace": "ns", "name": "o-driver"}}
    applied.remember(deployment, now=0.0, generation=2)
    assert applied.ours("ns", "Deployment", "o-driver", 2)
    assert not applied.ours("ns", "Deployment", "o-driver", 3)        # someone edited it after our apply
    assert not applied.ours("ns", "Deployment", "other", 2)
    applied.forget("ns", "Deployment", "o-driver")
    assert not applied.ours("ns", "Deployment", "o-driver", 2)        # forgotten: the next apply tells anew


def test_a_starting_driver_is_taken_from_the_index_while_the_handoff_is_not_ready() -> None:
    """A handoff that is not Ready has no Ready a mixed view could flip back: its starting driver comes from the
    index (a bulk apply read each starting driver's Deployment and pods from the API server ~3 times)."""
    settled = {**DEPLOYMENT, "status": {**DEPLOYMENT["status"], "observedGeneration": 3}}
    pending = pod("d-1", "2026-01-01T00:00:00Z", phase="Pending")
    pending["status"]["containerStatuses"] = []
    pending["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    starting = Seen(_slim_deployment(settled), [_slim_pod(pending)])
    assert starting.settled_driver(was_ready=True) is None              # Ready before: read the API server
    assert starting.settled_driver(was_ready=False) == starting.driver()
    assert starting.driver().pod_phase == "Pending" and not starting.driver().pod_ready
    assert Seen(None).settled_driver(was_ready=False) is None            # no Deployment in the index yet


def test_a_body_is_a_merge_base_when_only_kopfs_own_metadata_moved_on() -> None:
    """handlers._handoff_under_lock takes a handler's or index's body instead of a GET when current_enough."""
    from handoff_operator.spec.render import REPLAY_ANNOTATION
    from handoff_operator.truth.watched import UNKNOWN, current_enough, reconciled_view

    written = {"metadata": {"name": "o", "uid": "u1", "generation": 2, "resourceVersion": "10",
                            "finalizers": ["handoff.io/finalizer"], "annotations": {"note": "x"}},
               "spec": {"suspend": False}, "status": {"app": {"configHash": "h2"}, "observedGeneration": 2}}
    known = reconciled_view(written)
    kopf_patched = copy.deepcopy(written)  # kopf's progress / last-handled-configuration patch after the handler
    kopf_patched["metadata"]["resourceVersion"] = "11"
    kopf_patched["metadata"]["annotations"]["handoff.io/last-handled-configuration"] = "{...}"
    assert current_enough(kopf_patched, known)
    older = copy.deepcopy(written)  # before this process's own status patch: its configHash is the old one
    older["metadata"]["resourceVersion"] = "9"
    older["status"] = {"app": {"configHash": "h1"}, "observedGeneration": 1}
    assert not current_enough(older, known)
    edited = copy.deepcopy(kopf_patched)  # somebody changed the spec since
    edited["metadata"]["generation"], edited["spec"] = 3, {"suspend": True}
    assert not current_enough(edited, known)
    replaying = copy.deepcopy(kopf_patched)  # an annotation the reconcile acts on
    replaying["metadata"]["annotations"][REPLAY_ANNOTATION] = "r1"
    assert not current_enough(replaying, known)
    recreated = copy.deepcopy(kopf_patched)
    recreated["metadata"]["uid"] = "u2"
    assert not current_enough(recreated, known)
    assert current_enough(older, None), "never reconciled by this process: the body is as good as a GET"
    assert not current_enough(written, UNKNOWN), "after a status patch whose result is not known: GET"
