"""What one controller asks of another without importing it.

The ReplayRequest controller changes a handoff's annotations (claim, hold, release) and needs the handoff's
reconcile to apply them at once (the driver's replicas, the phase), not at the next status refresh. The
StreamTableHandoff controller registers its reconcile here when it is imported, so the two controllers never
import each other (an import circle, and the replay side reaching into a private name of the other, before).
"""
from __future__ import annotations

from collections.abc import Callable

from handoff_operator.runtime.kube import Kube

#: reconcile(namespace, name, kube) of one StreamTableHandoff, without a truth read.
HandoffReconcile = Callable[[str, str, Kube], object]

_handoff_reconcile: HandoffReconcile | None = None


def serve_handoff_reconcile(reconcile: HandoffReconcile) -> None:
    """Called by the StreamTableHandoff controller as it registers its handlers."""
    global _handoff_reconcile
    _handoff_reconcile = reconcile


#: record_reread(namespace, name, kube, records, estimated_bytes) of one StreamTableHandoff.
RereadRecorder = Callable[[str, str, Kube, int, "int | None"], object]

_reread_recorder: RereadRecorder | None = None


def serve_reread_recorder(recorder: RereadRecorder) -> None:
    """Called by the StreamTableHandoff controller as it registers its handlers."""
    global _reread_recorder
    _reread_recorder = recorder


def record_reread(namespace: str, name: str, kube: Kube, records: int, estimated_bytes: int | None) -> None:
    """Add a finished replay's or backfill's re-read to the handoff's status.cost (under its lock)."""
    if _reread_recorder is None:
        raise RuntimeError("the StreamTableHandoff controller is not loaded (handoff_operator.register_handlers)")
    _reread_recorder(namespace, name, kube, records, estimated_bytes)


def reconcile_handoff(namespace: str, name: str, kube: Kube) -> None:
    """Let the handoff's reconcile apply what its annotations now say."""
    if _handoff_reconcile is None:
        raise RuntimeError("the StreamTableHandoff controller is not loaded (handoff_operator.register_handlers)")
    _handoff_reconcile(namespace, name, kube)
