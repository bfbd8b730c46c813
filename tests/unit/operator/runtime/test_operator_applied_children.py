"""kube.AppliedChildren: a child whose rendered body did not change is not applied again until its resync, unless
it was forgotten (its Deployment changed, its handoff was deleted)."""
from __future__ import annotations

from handoff_operator.runtime.kube import AppliedChildren


def child(kind: str, name: str, data: str = "a") -> dict:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "ns"}, "data": {"k": data}}


def test_same_body_is_current_until_resync_changed_body_is_not() -> None:
    applied = AppliedChildren(resync=100.0)
    cm = child("ConfigMap", "orders-app")
    assert not applied.current(cm, 0.0)
    applied.remember(cm, 0.0)
    assert applied.current(cm, 50.0)
    assert not applied.current(child("ConfigMap", "orders-app", "b"), 50.0)
    assert not applied.current(cm, 111.0)  # resync is 100 s ± 10%


def test_forgetting_a_deployment_or_an_owner_applies_it_again() -> None:
    applied = AppliedChildren(resync=100.0)
    deployment, cm, other = child("Deployment", "orders-driver"), child("ConfigMap", "orders-app"), \
        child("ConfigMap", "refunds-app")
    for obj in (deployment, cm, other):
        applied.remember(obj, 0.0)
    applied.forget("ns", "Deployment", "orders-driver")
    assert not applied.current(deployment, 1.0) and applied.current(cm, 1.0)
    applied.forget_owner("ns", "orders")
    assert not applied.current(cm, 1.0) and applied.current(other, 1.0)
