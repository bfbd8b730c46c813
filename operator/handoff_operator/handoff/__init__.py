"""The StreamTableHandoff controller: the kopf handlers and the one idempotent reconcile (`handlers`),
conditions from facts (`conditions`, pure), the decide step from facts to the typed status and Events
(`status`, pure) and kopf's slimmer diff-base (`diffbase`).

Imports every decision folder (`spec`, `truth`, `scaling`, `upgrade`, `retention`) and `runtime`; imported by
`cli` only.
"""
