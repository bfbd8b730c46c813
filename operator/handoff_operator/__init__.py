"""Handoff operator: StreamTableHandoff → a Spark-on-Kubernetes app writing Kafka topics to a table.

`kopf run -m handoff_operator` imports this package, so the kopf handlers must register on import.
They are imported only when kopf is already loaded (always the case under `kopf run`, `handoff operator`
and the operator tests): importing the models or the CRD generator then stays free of kopf, the
Kubernetes client and Kafka.
"""
import sys

if "kopf" in sys.modules:
    from handoff_operator.handoff import handlers  # noqa: F401  (registers the handlers)
