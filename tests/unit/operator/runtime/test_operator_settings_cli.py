"""Operator settings from the environment and the `handoff` CLI's local config rendering."""
from __future__ import annotations

import json

import yaml

from handoff_operator.cli import local_checkpoint_env, local_config
from handoff_operator.runtime.settings import OperatorSettings

from operator_spec_support import body, spec


def test_settings_from_env(monkeypatch):
    monkeypatch.setenv("HANDOFF_NAMESPACES", "shop, analytics")
    monkeypatch.setenv("HANDOFF_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("HANDOFF_METRICS_PORT", "9102")
    monkeypatch.setenv("HANDOFF_STATUS_INTERVAL", "7.5")
    monkeypatch.setenv("HANDOFF_REPLAY_HOLD_ACK_SECONDS", "20")
    s = OperatorSettings()
    assert (s.namespaces, s.log_level, s.metrics_port, s.status_interval) == (["shop", "analytics"], "DEBUG",
                                                                            9102, 7.5)
    assert s.replay_hold_ack_seconds == 20.0


def test_settings_defaults_and_metrics_off(monkeypatch):
    for key in ("HANDOFF_NAMESPACES", "HANDOFF_METRICS_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert OperatorSettings().namespaces == []
    monkeypatch.setenv("HANDOFF_METRICS_PORT", "0")
    assert OperatorSettings().metrics_port is None


def test_local_config_runs_spark_locally(tmp_path):
    manifest = yaml.safe_load(yaml.safe_dump(body()))
    config = json.loads(local_config(manifest, str(tmp_path / "ckpt"), "local[2]"))
    assert config["sparkConf"]["spark.master"] == "local[2]"
    assert not any(k.startswith("spark.kubernetes.") for k in config["sparkConf"])
    assert config["checkpointLocation"] == str(tmp_path / "ckpt")
    assert config["handoffId"] == "shop/orders"


def test_a_local_run_of_an_s3_checkpoint_gets_its_settings_but_no_secret():
    manifest = {"kind": "StreamTableHandoff", "metadata": {"name": "orders"},
                "spec": spec(checkpoint={"location": "s3a://lake/ckpt", "credentialsSecret": "ckpt-s3",
                                         "endpoint": "http://127.0.0.1:9000", "pathStyleAccess": True})}
    assert local_checkpoint_env(manifest) == {"HANDOFF_CHECKPOINT_S3_ENDPOINT": "http://127.0.0.1:9000",
                                              "HANDOFF_CHECKPOINT_S3_PATH_STYLE": "true"}
    assert local_checkpoint_env({"spec": spec()}) == {}


def test_a_local_run_of_a_gcs_checkpoint_gets_its_settings_but_not_the_pods_key_path():
    manifest = {"kind": "StreamTableHandoff", "metadata": {"name": "orders"},
                "spec": spec(checkpoint={"location": "gs://lake/ckpt", "credentialsSecret": "ckpt-gcs",
                                         "endpoint": "http://127.0.0.1:4443"})}
    assert local_checkpoint_env(manifest) == {"HANDOFF_CHECKPOINT_GCS_ENDPOINT": "http://127.0.0.1:4443"}
    anonymous = {"spec": spec(checkpoint={"location": "gs://lake/ckpt", "anonymous": True})}
    assert local_checkpoint_env(anonymous) == {"HANDOFF_CHECKPOINT_GCS_ANONYMOUS": "true"}


def test_kopf_run_module_import_registers_the_handlers():
    """`kopf run -m handoff_operator` imports the package (with kopf loaded): handlers must register."""
    import subprocess
    import sys

    code = ("import kopf, handoff_operator; reg = kopf.get_default_registry(); "
            "print(sorted(h.id for h in reg._changing.get_all_handlers()), "
            "sorted(h.id for h in reg._spawning.get_all_handlers()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "on_spec" in out and "refresh_status" in out
    # Without kopf loaded (models, CRD generator) nothing operator-ish is imported.
    code = "import sys, handoff_operator.models; print('kopf' in sys.modules, 'kubernetes' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_in_cluster_server_comes_from_the_service_environment_not_dns() -> None:
    from handoff_operator.runtime.kube import in_cluster_server

    assert in_cluster_server({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}) \
        == "https://10.96.0.1:443"
    assert in_cluster_server({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}) \
        == "https://[fd00::1]:443"
    assert in_cluster_server({}) is None


def test_the_first_status_refresh_comes_at_once_and_later_ones_are_spread() -> None:
    from handoff_operator.handoff.handlers import refresh_wait

    assert refresh_wait(15.0, after_first=True, draw=0.0) == 15.0
    assert refresh_wait(15.0, after_first=True, draw=0.999) < 25.0
    assert refresh_wait(60.0, after_first=True, draw=0.5) == 65.0          # spread at most 10 s
    assert 13.5 <= refresh_wait(15.0, after_first=False, draw=0.0) < refresh_wait(15.0, False, 0.999) <= 16.5
