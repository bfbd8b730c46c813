"""The image entrypoint's `executor` branch, run for real: Spark's Kubernetes backend starts executor
pods with the argument `executor` and SPARK_* variables, and our script must turn that into a JVM
running KubernetesExecutorBackend from the pyspark jars. With no driver listening, a correct launch gets
as far as connecting to the driver URL (and fails there); a wrong class path, class name or argument
fails earlier with a different error."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_executor_branch_launches_the_kubernetes_executor_backend(tmp_path: Path) -> None:
    java = shutil.which("java")
    assert java, "java (JRE 17) must be installed for the Spark tests"
    port = _free_port()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "JAVA_HOME": str(Path(os.path.realpath(java)).parents[1]),
        "SPARK_JAVA_OPT_0": "-Dspark.network.timeout=5s",
        "SPARK_JAVA_OPT_1": f"-Djava.io.tmpdir={tmp_path}",
        "SPARK_EXECUTOR_MEMORY": "256m",
        "SPARK_DRIVER_URL": f"spark://CoarseGrainedScheduler@127.0.0.1:{port}",
        "SPARK_EXECUTOR_ID": "1",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_APPLICATION_ID": "spark-test-app",
        "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
        "SPARK_EXECUTOR_POD_NAME": "handoff-test-exec-1",
    }
    out = subprocess.run(["bash", str(REPO / "docker/entrypoint.sh"), "executor"], env=env,
                         capture_output=True, text=True, timeout=180, cwd=tmp_path)
    log = out.stdout + out.stderr
    assert out.returncode != 0
    assert "Usage" not in log and "ClassNotFoundException" not in log, log[-3000:]
    assert f"Failed to connect to /127.0.0.1:{port}" in log, log[-3000:]
