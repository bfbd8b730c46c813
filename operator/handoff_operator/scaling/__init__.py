"""Executor scaling on lag: how many executors a handoff should run (`rule`, pure over plain data) and the step
that gathers the facts, decides and acts in the status refresh (`step`).

Imports `models`, `runtime`, `truth`; imported by `handoff`.
"""
