"""crds/ is generated from the models and must not be stale; the generated schema is structural (checked
here offline; tests/integration/operator/crd/test_crds_apiserver.py has a real kube-apiserver accept it); the examples
validate against it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel

from handoff_operator.crd import generate as crdgen
from handoff_operator.models import ALL_RESOURCES, ReplayRequest, StreamTableHandoff
from handoff_operator.models.common import CustomResource

REPO = Path(__file__).resolve().parents[4]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def test_crds_are_not_stale() -> None:
    stale = crdgen.stale_files(REPO)
    assert not stale, "stale CRDs (run `make crds`):\n" + "\n".join(diff for _, diff in stale)


def test_check_mode_detects_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crdgen.main(["--root", str(tmp_path)]) == 0
    assert crdgen.main(["--root", str(tmp_path), "--check"]) == 0
    crd = tmp_path / "charts/handoff-operator/crds/streamtablehandoffs.handoff.io.yaml"
    crd.write_text(crd.read_text().replace("maxExecutors", "maxExecutor"))
    assert crdgen.main(["--root", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "maxExecutors" in err and "1 generated file(s) stale" in err


_ALLOWED_KEYS = {
    "description", "type", "format", "enum", "default", "pattern", "minLength", "maxLength", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "maxProperties",
    "required", "properties", "additionalProperties", "items", "nullable", "x-kubernetes-validations",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
}


def _walk(node: dict[str, Any], path: str = "") -> list[str]:
    problems = [f"{path}: {k}" for k in node if k not in _ALLOWED_KEYS]
    if "type" not in node and not node.get("x-kubernetes-int-or-string") \
            and not node.get("x-kubernetes-preserve-unknown-fields"):
        problems.append(f"{path}: no type")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: properties and additionalProperties")
    for name, sub in node.get("properties", {}).items():
        problems += _walk(sub, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        problems += _walk(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        problems += _walk(node["items"], f"{path}[]")
    if node.get("x-kubernetes-list-type") == "map":
        for key in node["x-kubernetes-list-map-keys"]:
            item = node["items"]
            assert key in item.get("required", []) or "default" in item["properties"][key], (path, key)
    return problems


@pytest.mark.parametrize("model", ALL_RESOURCES, ids=lambda m: m.__name__)
def test_schema_is_structural(model: type[CustomResource]) -> None:
    crd = crdgen.crd_for(model)
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    schema = version["schema"]["openAPIV3Schema"]
    assert _walk(schema) == []
    assert schema["properties"]["status"]["properties"]["conditions"]["x-kubernetes-list-map-keys"] == ["type"]


def test_names_and_printer_columns() -> None:
    sth = crdgen.crd_for(StreamTableHandoff)
    assert sth["metadata"]["name"] == "streamtablehandoffs.handoff.io"
    assert sth["spec"]["names"]["shortNames"] == ["sth"]
    assert sth["spec"]["names"]["categories"] == ["handoff"]
    cols = [c["name"] for c in sth["spec"]["versions"][0]["additionalPrinterColumns"] if not c.get("priority")]
    assert cols == ["Phase", "Lag", "Freshness", "Executors", "Age"]
    replay = crdgen.crd_for(ReplayRequest)
    assert replay["spec"]["names"]["shortNames"] == ["replay"]
    assert [c["name"] for c in replay["spec"]["versions"][0]["additionalPrinterColumns"]] == \
        ["Phase", "Handoff", "Mode", "Age"]


def test_non_structural_models_are_refused() -> None:
    class Bad(BaseModel):
        value: int | str

    schema = Bad.model_json_schema()
    with pytest.raises(crdgen.NotStructural, match="union of 2 types"):
        crdgen.structural(schema, schema.get("$defs", {}))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_crd_schema(path: Path) -> None:
    manifest = yaml.safe_load(path.read_text())
    model = next(m for m in ALL_RESOURCES if m.model_fields["kind"].default == manifest["kind"])
    schema = crdgen.crd_for(model)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.validate(manifest, schema)
