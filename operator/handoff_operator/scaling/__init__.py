"""Executor scaling on lag: how many executors a handoff should run (`rule`, pure over plain data) and its
part of each reconcile's steps (`step`: `measure` gathers, `decide_step` decides (pure), `act` acts).

Imports `models`, `conditions`, `runtime`, `spec` (the ConfigMap's name) and the data plane's `ledger.lag`; imported
by `handoff`.
"""
