"""`kubectl handoff ledger NAME`: the handoff's ledger read from its table, with the sink and catalog settings
the operator itself would give the driver (the resource's spec plus the Secrets it references), read through
the user's kubeconfig. The catalog must be reachable from this machine; `--catalog-property uri=...` points at
a port-forwarded or external address instead of the in-cluster one."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from handoff_operator.runtime.kube import Kube
from handoff_operator.spec.render import Resolved, app_config, referenced_secrets, resolve
from handoff_operator.spec.validation import parse_spec


class LedgerError(Exception):
    """The ledger cannot be read for a reason the user can fix (one line)."""


def config_for(kube: Kube, obj: Mapping[str, Any], overrides: Mapping[str, str]) -> Any:
    """The driver's AppConfig for this handoff (secrets resolved), with catalog property overrides."""
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    spec, problems = parse_spec(obj.get("spec") or {})
    if spec is None:
        raise LedgerError(f"{namespace}/{name}: the spec is invalid ({problems[0]}); see its status conditions")
    secrets = kube.read_secrets(namespace, sorted(referenced_secrets(spec)))
    resolved, missing = resolve(spec, secrets)
    if missing:
        field, message = missing[0]
        raise LedgerError(f"{field}: {message}")
    if overrides:
        if spec.sink.iceberg is None:
            raise LedgerError("--catalog-property applies to Iceberg sinks only")
        resolved = Resolved(resolved.source_properties, {**resolved.catalog_properties, **overrides})
    return app_config(spec, namespace, name, image="kubectl-handoff", resolved=resolved)


def entries(kube: Kube, obj: Mapping[str, Any], overrides: Mapping[str, str], limit: int | None
            ) -> list[dict[str, Any]]:
    from handoff_spark.ledger import entries as ledger_entries

    return ledger_entries(config_for(kube, obj, overrides), limit)
