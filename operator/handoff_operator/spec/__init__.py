"""A StreamTableHandoff's spec: checks the CRD schema cannot express (`validation`, pure), rendering the app
config and the child manifests (`render`, pure) and the once-per-change cache of both (`rendered`).

Imports `models` and the data plane's `config`; imported by `handoff`, `replay` and `cli`.
"""
