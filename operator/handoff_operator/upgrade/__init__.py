"""Automatic rollback of a failed upgrade: keep, mark good or roll back (`rule`, pure) and its part of
each reconcile's steps (`step`: `gather_last_good` reads, `decide_step` decides (pure), `act` acts); `replay` takes
the spec that runs from it (`held_spec`).

May import: `models`, `conditions`, `runtime`, `spec`.
Imported by `handoff` and `replay` (the config the driver runs while a failed upgrade is rolled back).
"""
