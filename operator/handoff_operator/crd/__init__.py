"""The CRDs and the API reference, generated from `models` (`generate`: `python -m
handoff_operator.crd.generate [--check]`; `apidoc`).

May import: `models`, `health` (the Argo CD checks the chart carries), `yaml_text`.
Imported by nothing at run time (the generator runs as a script, and by the tests).
"""
