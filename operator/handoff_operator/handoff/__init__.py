"""The StreamTableHandoff controller: the kopf handlers and the one idempotent reconcile, gather → decide → act
(`handlers`), the decide step (`status`, pure: from gathered facts to what to do, then to the typed status and
Events) and kopf's slimmer diff-base (`diffbase`). The condition vocabulary and facts it decides over are
`handoff_operator.conditions` (every controller uses them).

May import: `spec`, `truth`, `scaling`, `upgrade`, `retention` (every decision folder), `conditions`, `models` and
`runtime`. It never imports the ReplayRequest controller (`replay`): it serves its reconcile to it through
`runtime.controllers`.
Imported only by `handoff_operator.register_handlers` (the package's `__init__`, which `cli` and kopf use).
"""
