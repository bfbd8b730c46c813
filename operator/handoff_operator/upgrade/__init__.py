"""Automatic rollback of a failed upgrade: keep, mark good or roll back (`rule`, pure) and the step reconcile runs
(`step`).

Imports `models`, `runtime`, `spec`; imported by `handoff`.
"""
