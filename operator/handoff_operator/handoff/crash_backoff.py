"""A driver pod waiting out a crash back-off when the operator changes its query config: replaced at once (pure).

Why: a change of what the query does (the transform, the source's topics or servers, the pace, …: `contract.
QUERY_CONFIG_*`) leaves the pod template as it was; a running driver applies it in place (`driver.query_config`),
and a driver that starts reads it before its first batch. But a driver that has crashed (a topic Kafka lacks, a
table the ledger does not fit, a SQL refused at start) waits in the kubelet's back-off, up to 5 minutes, before it
starts again, and the change that fixes it is often exactly such a change (or the upgrade rule's rollback of one).
Before these changes moved into the running driver they rolled the pod, so the fix ran at once; this keeps that:
the operator deletes the waiting pod and its Deployment starts a new one now, which reads the new config.

Decided when the wanted config changes, and only then: a pod in a back-off at that moment crashed with a config
before it. A pod that crashes later started with the new one (a driver reads the operator's query config at its
start), so its back-off is the kubelet's, and a crash loop is the upgrade rule's to roll back (`upgrade.rule`).
"""
from __future__ import annotations

from handoff_operator.conditions import DriverFacts
from handoff_operator.upgrade.rule import CRASH_LOOP_BACK_OFF


def crashed_pod_to_replace(driver: DriverFacts | None, before: str | None, config_hash: str,
                           pod_hash: str) -> str | None:
    """The driver pod to delete so that a new one runs `config_hash` now (None: none), as the wanted config changes
    from `before` to `config_hash`: a pod of the wanted template (another one is rolled by its Deployment anyway) that
    waits out a crash back-off and does not say it ran `config_hash`."""
    if before is None or before == config_hash:
        return None
    if driver is None or driver.pod_name is None or driver.desired_replicas < 1:
        return None
    if driver.waiting_reason != CRASH_LOOP_BACK_OFF or driver.pod_config_hash != pod_hash:
        return None
    if driver.running_config_hash == config_hash:
        return None
    return driver.pod_name
