"""Pod resources of the driver and the executors (cores, coreRequest, coreLimit, memory, memoryOverhead,
memoryOverheadFactor): the driver container's requests and limits are what Spark is told, the executors' settings
reach Spark's conf, a spec without them renders what it did before they existed, and the refusals name the field."""
from __future__ import annotations

import json
from typing import Any

import pytest

from handoff_operator.spec.render import Rendered
from handoff_operator.spec.validation import check, parse_spec

from operator_spec_support import SECRETS, body, render_valid, spec


def _spec(driver: dict[str, Any] | None = None, executor: dict[str, Any] | None = None,
          spark_conf: dict[str, str] | None = None) -> dict[str, Any]:
    s = spec()
    s["spark"]["driver"].update(driver or {})
    s["spark"]["executor"].update(executor or {})
    if spark_conf is not None:
        s["spark"]["sparkConf"] = spark_conf
    return s


def _render(spec_dict: dict[str, Any]) -> Rendered:
    return render_valid(spec_dict)


def _problems(spec_dict: dict[str, Any]) -> list[str]:
    parsed, problems = parse_spec(body(spec_dict)["spec"])
    if parsed is None:
        return [str(p) for p in problems]
    return [str(p) for p in check("orders", parsed, SECRETS)[1]]


def _driver_resources(r: Rendered) -> dict[str, Any]:
    (container,) = r.child("Deployment")["spec"]["template"]["spec"]["containers"]
    return container["resources"]


def _conf(r: Rendered) -> dict[str, str]:
    return json.loads(r.config.to_json())["sparkConf"]


def test_unset_resources_render_what_they_did_before():
    r = _render(_spec())
    assert _driver_resources(r) == {"requests": {"cpu": "1", "memory": "1433Mi"},
                                    "limits": {"cpu": "1", "memory": "1433Mi"}}
    conf = _conf(r)
    assert not any("memoryOverhead" in key for key in conf)
    cores = str(spec()["spark"]["executor"].get("cores", 1))
    assert (conf["spark.kubernetes.executor.request.cores"], conf["spark.kubernetes.executor.limit.cores"]) == \
        (cores, cores)


@pytest.mark.parametrize(("driver", "memory", "told"), [
    ({"memory": "1Gi", "memoryOverhead": "512Mi"}, "1536Mi", "512m"),
    ({"memory": "2Gi", "memoryOverheadFactor": 0.25}, "2560Mi", "512m"),
    ({"memory": "1Gi", "memoryOverheadFactor": 0.1}, "1408Mi", "384m"),    # never below Spark's 384Mi
    ({"memory": "4Gi"}, "5734Mi", None),                                   # the default factor, 0.4
])
def test_the_driver_container_is_heap_plus_overhead_and_spark_is_told_the_overhead(driver, memory, told):
    r = _render(_spec(driver=driver))
    resources = _driver_resources(r)
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == memory
    assert _conf(r).get("spark.driver.memoryOverhead") == told
    env = {e["name"]: e.get("value") for e in r.child("Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    heap = int(memory.removesuffix("Mi")) - (int(told.removesuffix("m")) if told else 1638)
    assert f"--driver-memory {heap}m" in env["PYSPARK_SUBMIT_ARGS"]


def test_cpu_requests_and_limits_are_written_as_the_api_server_writes_them():
    r = _render(_spec(driver={"cores": 2, "coreRequest": "0.5"},
                      executor={"cores": 4, "coreRequest": "1.25", "coreLimit": "3000m"}))
    resources = _driver_resources(r)
    assert (resources["requests"]["cpu"], resources["limits"]["cpu"]) == ("500m", "2")
    conf = _conf(r)
    assert (conf["spark.kubernetes.executor.request.cores"], conf["spark.kubernetes.executor.limit.cores"]) == \
        ("1250m", "3")
    assert conf["spark.executor.cores"] == "4"  # task slots stay the cores
    # A limit below the cores without a request: the request follows the limit (Kubernetes refuses request > limit).
    r = _render(_spec(driver={"cores": 2, "coreLimit": "1"}))
    assert _driver_resources(r)["requests"]["cpu"] == _driver_resources(r)["limits"]["cpu"] == "1"


def test_executor_overheads_reach_spark_which_sizes_the_executor_pods():
    conf = _conf(_render(_spec(executor={"memoryOverhead": "1.5Gi"})))
    assert conf["spark.executor.memoryOverhead"] == "1536m" and "spark.executor.memoryOverheadFactor" not in conf
    conf = _conf(_render(_spec(executor={"memoryOverheadFactor": 0.3})))
    assert conf["spark.executor.memoryOverheadFactor"] == "0.3" and "spark.executor.memoryOverhead" not in conf


def test_a_changed_overhead_restarts_the_driver_once():
    before, after = _render(_spec()), _render(_spec(driver={"memoryOverhead": "1Gi"}))
    assert before.config_hash != after.config_hash
    assert _render(_spec(driver={"memoryOverhead": "1Gi"})).config_hash == after.config_hash


@pytest.mark.parametrize(("driver", "executor", "spark_conf", "field", "words"), [
    ({}, {"cores": 1, "coreRequest": "2"}, None, "spec.spark.executor", "coreRequest 2 must not exceed coreLimit"),
    ({"cores": 2, "coreRequest": "2", "coreLimit": "1"}, {}, None, "spec.spark.driver", "raise coreLimit"),
    ({"memoryOverhead": "1Gi", "memoryOverheadFactor": 0.2}, {}, None, "spec.spark.driver",
     "memoryOverhead or memoryOverheadFactor, not both"),
    ({}, {"memoryOverheadFactor": 1.5}, None, "spec.spark.executor.memoryOverheadFactor", "less than or equal to 1"),
    ({}, {"coreLimit": "0.0001"}, None, "spec.spark.executor.coreLimit", "pattern"),
    ({}, {"memoryOverhead": "16Mi"}, None, "spec.spark.executor.memoryOverhead", "below 32Mi"),
    ({}, {}, {"spark.driver.memoryOverhead": "2g"}, "spec.spark.sparkConf[spark.driver.memoryOverhead]",
     "spec.spark.driver.memory, memoryOverhead or memoryOverheadFactor"),
    ({}, {"memoryOverhead": "1Gi"}, {"spark.executor.memoryOverheadFactor": "0.2"},
     "spec.spark.sparkConf[spark.executor.memoryOverheadFactor]", "spec.spark.executor.memoryOverhead"),
    ({}, {"coreRequest": "500m"}, {"spark.kubernetes.executor.limit.cores": "4"},
     "spec.spark.sparkConf[spark.kubernetes.executor.limit.cores]", "coreRequest and coreLimit"),
])
def test_what_cannot_work_is_refused_naming_the_field(driver, executor, spark_conf, field, words):
    problems = _problems(_spec(driver=driver, executor=executor, spark_conf=spark_conf))
    assert any(p.startswith(f"{field}") and words in p for p in problems), problems


def test_executor_settings_in_spark_conf_still_work_without_the_typed_fields():
    """Before these fields, sparkConf was the way to size executors; it still is when the fields are unset."""
    conf = _conf(_render(_spec(spark_conf={"spark.kubernetes.executor.request.cores": "250m",
                                           "spark.executor.memoryOverhead": "1g"})))
    assert conf["spark.kubernetes.executor.request.cores"] == "250m" and conf["spark.executor.memoryOverhead"] == "1g"
