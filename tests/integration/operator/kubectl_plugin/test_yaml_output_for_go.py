"""What `-o yaml` (and the CRD generator, and the test bed's `kubectl apply`) writes, real kubectl and the API
server read back as the same strings. PyYAML leaves `57280e00`, `1e5`, `0o17` or `y` unquoted; Go's YAML reads
them as numbers and booleans. A random toleration value `57280e00` once failed an in-cluster test that way."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from handoff_operator.kubectl_plugin.output import print_document
from operator_support import Cluster, kubectl

pytestmark = pytest.mark.apiserver

# Strings go-yaml reads as another type unless quoted (and a few PyYAML already quotes, which must stay so).
TRICKY = ["57280e00", "1e5", "-1E-3", "0o17", "0x1F", "0b101", "1_000", ".5", "y", "N", "on", "no", "~", "12",
          "true", "1.5", "5e", "plain"]


def _config_map(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tricky", "namespace": namespace},
            "data": {f"k{i}": value for i, value in enumerate(TRICKY)}}


def test_what_o_yaml_prints_kubectl_applies_with_the_same_strings(cluster: Cluster, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    doc = _config_map(cluster.new_namespace("yaml"))
    print_document(doc, "yaml", str)
    path = tmp_path / "tricky.yaml"
    path.write_text(capsys.readouterr().out)
    applied = kubectl(cluster.kubeconfig, "apply", "--server-side", "-f", str(path), "-o", "json")
    assert json.loads(applied.stdout)["data"] == doc["data"]


def test_plain_pyyaml_output_is_what_kubectl_misreads(cluster: Cluster, tmp_path: Path) -> None:
    """Why the dumper exists: the same document through `yaml.safe_dump` is refused (a number where the
    ConfigMap wants a string). If PyYAML ever quotes these itself, this fails and the dumper can go."""
    path = tmp_path / "tricky.yaml"
    path.write_text(yaml.safe_dump(_config_map(cluster.new_namespace("yaml"))))
    result = kubectl(cluster.kubeconfig, "apply", "--server-side", "-f", str(path), check=False)
    assert result.returncode != 0
    assert "data.k0" in result.stderr or "expected string" in result.stderr, result.stderr
