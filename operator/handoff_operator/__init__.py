"""Handoff operator: StreamTableHandoff → a Spark-on-Kubernetes app writing Kafka topics to a table.

`kopf run -m handoff_operator` imports this package, so the kopf handlers must register on import.
They are imported only when kopf is already loaded (always the case under `kopf run`, `handoff operator`
and the operator tests): importing the models or the CRD generator then stays free of kopf, the
Kubernetes client and Kafka.
"""
import sys


def register_handlers() -> None:
    """Import both controllers, which registers their kopf handlers: the StreamTableHandoffs' (`handoff`) and
    the ReplayRequests' (`replay`). Neither imports the other (they meet in `runtime`), so both are named here."""
    from handoff_operator.handoff import handlers  # noqa: F401
    from handoff_operator.replay import handlers as replay_handlers  # noqa: F401


if "kopf" in sys.modules:
    register_handlers()
