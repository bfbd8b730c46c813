"""What every controller shares at run time: Kubernetes API access and the operator's one client
(`kube.operator_kube`), the operator's Prometheus metrics (`metrics`), settings from the environment
(`settings.current_settings`), what one controller asks of another (`controllers`: the handoff's reconcile,
for the ReplayRequest controller) and what the process remembers of each handoff, with its one `forget` (`state`).

May import: `models`, `conditions`, `spec.render` (names and labels), `truth.driver_report` (its key) and
`handoff_spark.contract` (the progress record's names).
Imported by every controller, `kubectl_plugin` and `cli`.
"""
