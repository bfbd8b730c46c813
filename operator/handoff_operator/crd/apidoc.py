"""The API reference (docs/api-reference.md), written from the generated CRD schemas by
`python -m handoff_operator.crd.generate`, so the page users read says exactly what the API server enforces
(same descriptions, defaults, limits and validation messages) and cannot go stale unnoticed
(`crdgen --check` covers it)."""
from __future__ import annotations

import json
from typing import Any


def _type(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "int or string"
    kind = node.get("type", "object")
    if kind == "array":
        return f"[]{_type(node.get('items', {}))}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type(node['additionalProperties'])}"
    if node.get("format") == "date-time":
        return "timestamp"
    return kind


def _constraints(node: dict[str, Any]) -> str:
    parts = []
    if "enum" in node:
        parts.append("one of " + ", ".join(f"`{v}`" for v in node["enum"]))
    for key, label in (("minimum", "≥"), ("maximum", "≤"), ("minItems", "min items"),
                       ("maxItems", "max items"), ("minLength", "min length"), ("maxLength", "max length"),
                       ("maxProperties", "max entries")):
        if key in node:
            parts.append(f"{label} {node[key]}")
    if "pattern" in node and "enum" not in node:
        parts.append(f"pattern `{node['pattern']}`")
    if node.get("x-kubernetes-list-type") == "map":
        parts.append("unique " + ", ".join(node.get("x-kubernetes-list-map-keys", [])))
    elif node.get("x-kubernetes-list-type") == "set":
        parts.append("unique")
    return "; ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n\n", "<br>").replace("\n", " ")


def _rows(node: dict[str, Any], path: str, required: bool, rules: list[tuple[str, str]],
          root_label: str = "") -> list[str]:
    rows = []
    if path:
        default = f"`{json.dumps(node['default'])}`" if "default" in node else ""
        desc = node.get("description", "")
        extra = _constraints(node)
        if extra:
            desc = f"{desc} ({extra})" if desc else extra
        rows.append(f"| `{path}` | {_type(node)} | {'yes' if required else ''} | {default} | {_cell(desc)} |")
    for rule in node.get("x-kubernetes-validations", []):
        rules.append((path or root_label, rule["message"]))
    target = node
    sub_path = path
    if node.get("type") == "array" and node.get("items", {}).get("type") == "object":
        target, sub_path = node["items"], f"{path}[]"
        for rule in target.get("x-kubernetes-validations", []):
            rules.append((sub_path, rule["message"]))
    req = set(target.get("required", []))
    for name, sub in target.get("properties", {}).items():
        rows += _rows(sub, f"{sub_path}.{name}" if sub_path else name, name in req, rules, root_label)
    return rows


def _section(title: str, node: dict[str, Any], operator_checks: list[str] = ()) -> list[str]:
    rules: list[tuple[str, str]] = []
    rows = _rows(node, "", False, rules, title)
    out = [f"### {title}", "", "| Field | Type | Required | Default | Description |", "|---|---|---|---|---|",
           *rows, ""]
    if rules:
        out += ["Validation rules (enforced by the API server):", ""]
        out += [f"- `{where}`: {_cell(message)}" for where, message in rules]
        out.append("")
    if operator_checks:
        out += ["Checked by the operator (the object is accepted, then reported `Ready=False`, reason "
                "`InvalidSpec`, because the API server's CEL cannot parse day durations):", ""]
        out += [f"- {_cell(message)}" for message in operator_checks]
        out.append("")
    return out


def api_reference(crds: list[dict[str, Any]], operator_checks: dict[str, list[str]] | None = None) -> str:
    lines = ["# API reference", "",
             "Generated from the CRDs (themselves generated from `operator/handoff_operator/models/`) by "
             "`python -m handoff_operator.crd.generate`; do not edit.", ""]
    for crd in crds:
        names = crd["spec"]["names"]
        version = crd["spec"]["versions"][0]
        schema = version["schema"]["openAPIV3Schema"]
        lines += [f"## {names['kind']} ({crd['spec']['group']}/{version['name']})", "",
                  schema.get("description", ""), "",
                  f"Short names: {', '.join(f'`{n}`' for n in names.get('shortNames', []))}; "
                  f"categories: {', '.join(f'`{c}`' for c in names.get('categories', []))}. "
                  f"`kubectl get` columns: "
                  f"{', '.join(c['name'] for c in version.get('additionalPrinterColumns', []))}.", ""]
        for rule in schema.get("x-kubernetes-validations", []):
            lines += [f"- {rule['message']}"]
        if schema.get("x-kubernetes-validations"):
            lines.append("")
        lines += _section("spec", schema["properties"]["spec"], (operator_checks or {}).get(names["kind"], []))
        lines += _section("status", schema["properties"]["status"])
    return "\n".join(lines).rstrip() + "\n"
