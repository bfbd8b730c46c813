"""How a running ReplayRequest shows on its StreamTableHandoff: the hold annotation renders the driver at 0
replicas (same config, so no restart is counted), the replay annotation makes the phase Replaying."""
from __future__ import annotations

from handoff_operator.conditions import DriverFacts, Facts, evaluate
from handoff_operator.spec.render import QUERY_HOLD_VALUE, REPLAY_HOLD_ANNOTATION, render
from handoff_operator.spec.validation import check, parse_spec

from operator_spec_support import SECRETS, body


def _render(annotations: dict[str, str]):
    b = body()
    b["metadata"]["annotations"] = annotations
    parsed, _ = parse_spec(b["spec"])
    resolved, _ = check("orders", parsed, SECRETS)
    return render(b, parsed, "default/image:1", resolved)


def test_hold_scales_the_driver_to_zero_without_changing_the_config() -> None:
    running, held = _render({}), _render({REPLAY_HOLD_ANNOTATION: "true"})
    assert running.child("Deployment")["spec"]["replicas"] == 1
    assert held.child("Deployment")["spec"]["replicas"] == 0
    assert held.config_hash == running.config_hash


def test_a_query_hold_keeps_the_driver_pod_running() -> None:
    """The replay holds the query inside the driver (handoff_spark.driver.hold): the pod must stay."""
    in_place = _render({REPLAY_HOLD_ANNOTATION: QUERY_HOLD_VALUE})
    assert in_place.child("Deployment")["spec"]["replicas"] == 1
    assert in_place.config_hash == _render({}).config_hash


def test_a_replay_makes_the_handoff_replaying_not_ready() -> None:
    driver = DriverFacts(desired_replicas=1, replicas=1, ready_replicas=1, updated_replicas=1, pod_name="d-1",
                         pod_phase="Running", pod_ready=True, pod_config_hash="h1")
    ev = evaluate(Facts(generation=1, suspended=False, desired_hash="h1", driver=driver, replay="rewind"))
    c = {x.type: x for x in ev.conditions}
    assert ev.phase == "Replaying"
    assert (c["Ready"].status, c["Ready"].reason) == ("False", "Replaying") and "rewind" in c["Ready"].message
    assert c["Progressing"].status == "True" and c["Degraded"].status == "False"
    crashing = DriverFacts(desired_replicas=1, replicas=1, pod_name="d-2", waiting_reason="CrashLoopBackOff")
    ev = evaluate(Facts(generation=1, suspended=False, desired_hash="h1", driver=crashing, replay="rewind"))
    assert ev.phase == "Replaying" and {x.type: x for x in ev.conditions}["Degraded"].status == "True"
