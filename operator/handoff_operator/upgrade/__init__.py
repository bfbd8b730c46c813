"""Automatic rollback of a failed upgrade: keep, mark good or roll back (`rule`, pure) and the step reconcile runs
(`step`).

May import: `models`, `conditions`, `runtime`, `spec`.
Imported by `handoff` and `replay` (the config the driver runs while a failed upgrade is rolled back).
"""
