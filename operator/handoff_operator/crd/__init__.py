"""The CRDs and the API reference, generated from `models` (`generate`: `python -m
handoff_operator.crd.generate [--check]`; `apidoc`). Imports `models` and `health`; imported by nothing at run time.
"""
