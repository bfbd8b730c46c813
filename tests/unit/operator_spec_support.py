"""A small valid StreamTableHandoff for the operator's unit tests."""
from __future__ import annotations

import copy
from typing import Any

BASE_SPEC: dict[str, Any] = {
    "source": {"bootstrapServers": "kafka:9092", "topics": ["orders"],
               "properties": {"security.protocol": "SASL_SSL"},
               "propertiesFrom": [{"property": "sasl.password",
                                   "secretKeyRef": {"name": "kafka-creds", "key": "password"}}]},
    "sink": {"iceberg": {"catalog": {"name": "lake", "properties": {"type": "sql", "uri": "sqlite:///x.db"},
                                     "propertiesFrom": [{"secretRef": {"name": "lake-s3"}, "prefix": "s3."}]},
                         "table": "shop.orders", "partitionBy": ["day(created_at)", "bucket(8, id)"]}},
    "schema": {"columns": [{"name": "id", "type": "long", "required": True},
                           {"name": "created_at", "type": "timestamp"}],
               "eventTimeColumn": "created_at"},
    "commitInterval": "10s",
    "scaling": {"minExecutors": 1, "maxExecutors": 5},
    "spark": {"image": "registry.example/handoff:1.2", "driver": {"cores": 1, "memory": "1Gi"},
              "executor": {"cores": 2, "memory": "3Gi"}, "sparkConf": {"spark.sql.shuffle.partitions": "4"}},
}
SECRETS = {"kafka-creds": {"password": "s3cret"}, "lake-s3": {"access-key-id": "AK", "secret-access-key": "SK"}}


def spec(**overrides: Any) -> dict[str, Any]:
    out = copy.deepcopy(BASE_SPEC)
    out.update(overrides)
    return out


def body(spec_dict: dict[str, Any] | None = None, name: str = "orders", namespace: str = "shop") -> dict[str, Any]:
    return {"apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
            "metadata": {"name": name, "namespace": namespace, "uid": "uid-1", "generation": 1},
            "spec": spec_dict if spec_dict is not None else spec()}


def render_valid(spec_dict: dict[str, Any]) -> Any:
    """The children a valid spec renders to (asserting it parses and checks clean), with the test image."""
    from handoff_operator.spec.render import render
    from handoff_operator.spec.validation import check, parse_spec

    b = body(spec_dict)
    parsed, problems = parse_spec(b["spec"])
    assert not problems, problems
    resolved, problems = check("orders", parsed, SECRETS)
    assert not problems, problems
    return render(b, parsed, "default/image:1", resolved)
