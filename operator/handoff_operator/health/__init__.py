"""Argo CD custom health checks (Lua) for the Handoff resources, shipped with the package so the chart
and `docs/argocd.md` use the very scripts the tests run."""
from __future__ import annotations

from importlib import resources

SCRIPTS: dict[str, str] = {
    "StreamTableHandoff": "streamtablehandoff.lua",
    "ReplayRequest": "replayrequest.lua",
}


def health_lua(kind: str) -> str:
    """The Lua source of the health check for `kind`."""
    return resources.files(__name__).joinpath(SCRIPTS[kind]).read_text()


def argocd_cm_data(group: str = "handoff.io") -> dict[str, str]:
    """The argocd-cm `data` entries that install every check (`resource.customizations.health.<group>_<Kind>`)."""
    return {f"resource.customizations.health.{group}_{kind}": health_lua(kind) for kind in SCRIPTS}
