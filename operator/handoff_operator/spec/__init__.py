"""A StreamTableHandoff's spec: checks the CRD schema cannot express (`validation`, pure), rendering the app
config and the child manifests (`render`, pure) and the once-per-change cache of both (`rendered`).

May import: `models`, `runtime.kube` (reading the Secrets a spec references), `runtime.state` (where the render
cache keeps its entries), `handoff_spark.config`,
`handoff_spark.contract` and `handoff_spark.switches` (the data plane's public face: what the driver is given).
Imported by `handoff`, `replay`, `scaling`, `truth`, `upgrade`, `runtime` (names and labels), `kubectl_plugin`
and `cli`.
"""
