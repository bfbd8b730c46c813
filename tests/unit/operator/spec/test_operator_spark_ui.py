"""The driver's Spark UI (spec.spark.ui): its own ClusterIP Service `<name>-ui`, owned by the handoff, selecting the
driver pod's `ui` port; turned off with ui.service: false, which also asks the operator to delete the one it made."""
from __future__ import annotations

from typing import Any

from handoff_operator.spec.render import Rendered

from operator_spec_support import render_valid, spec


def _render(spec_dict: dict[str, Any]) -> Rendered:
    return render_valid(spec_dict)


def test_the_ui_gets_a_service_of_its_own_that_selects_the_drivers_ui_port():
    r = _render(spec())
    (ui,) = [c for c in r.children if c["kind"] == "Service" and c["metadata"]["name"] == "orders-ui"]
    deployment = r.child("Deployment")
    assert ui["metadata"]["ownerReferences"][0]["kind"] == "StreamTableHandoff"
    assert ui["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert ui["spec"]["ports"] == [{"name": "http", "port": 4040, "targetPort": "ui"}]
    assert "clusterIP" not in ui["spec"] and "type" not in ui["spec"]  # the API server's to fill in
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "ui", "containerPort": 4040} in container["ports"]
    assert r.absent == []


def test_ui_service_false_renders_none_and_asks_for_the_old_one_to_go():
    s = spec()
    s["spark"]["ui"] = {"service": False}
    r = _render(s)
    assert "orders-ui" not in [c["metadata"]["name"] for c in r.children]
    assert r.absent == [{"apiVersion": "v1", "kind": "Service",
                         "metadata": {"name": "orders-ui", "namespace": r.child("Deployment")["metadata"]["namespace"]}}]
    # The UI Service is not part of what the driver runs with: turning it off restarts no driver.
    assert r.config_hash == _render(spec()).config_hash
