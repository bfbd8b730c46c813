"""What every controller shares at run time: Kubernetes API access (`kube`), the operator's Prometheus metrics
(`metrics`) and settings from the environment (`settings`).

Imports `models` only; imported by every controller.
"""
