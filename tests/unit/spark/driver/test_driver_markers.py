"""A driver's marker directory: its own is new, and those of drivers that are gone (killed, never cleaned up) are
removed, while a live driver's is left alone."""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from handoff_spark import contract
from handoff_spark.driver import app


def test_a_new_driver_removes_the_marker_directories_of_drivers_that_are_gone(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid with no process behind it (as after a kill -9)
    live = subprocess.Popen(["sleep", "30"])
    try:
        dead_dir = tmp_path / f"{app.STOP_DIR_PREFIX}{gone.pid}-abc123"
        live_dir = tmp_path / f"{app.STOP_DIR_PREFIX}{live.pid}-def456"
        unrelated = tmp_path / f"{app.STOP_DIR_PREFIX}q1ewetur"  # an older driver's name, without a pid: kept
        for d in (dead_dir, live_dir, unrelated):
            d.mkdir()
        (dead_dir / "min-partitions").write_text("6")
        mine = Path(app.marker_dir())
        assert mine.parent == tmp_path and mine.name.startswith(f"{app.STOP_DIR_PREFIX}{os.getpid()}-")
        assert not dead_dir.exists() and live_dir.is_dir() and unrelated.is_dir() and mine.is_dir()
    finally:
        live.kill()
        live.wait()


def test_a_local_driver_jvm_gets_its_own_temporary_directory_and_a_users_own_wins(tmp_path, monkeypatch):
    """lz4-java's native library lands in the JVM's `java.io.tmpdir`; a local driver's is its own directory, swept
    like the markers once the driver is gone. A `java.io.tmpdir` of the user's own is kept."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead_jvm_dir = tmp_path / f"{app.JVM_TMP_PREFIX}{gone.pid}-xyz"
    dead_jvm_dir.mkdir()
    (dead_jvm_dir / "liblz4-java-123.so").write_bytes(b"\0")
    conf = app.local_jvm_tmp_dir({"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"})
    options = conf["spark.driver.extraJavaOptions"].split()
    assert options[0] == "-XX:TieredStopAtLevel=1"
    jvm_tmp = Path(options[1].removeprefix("-Djava.io.tmpdir="))
    assert options[1].startswith("-Djava.io.tmpdir=") and jvm_tmp.is_dir()
    assert jvm_tmp.parent == tmp_path and jvm_tmp.name.startswith(f"{app.JVM_TMP_PREFIX}{os.getpid()}-")
    assert not dead_jvm_dir.exists()
    own = {"spark.driver.extraJavaOptions": "-Djava.io.tmpdir=/var/tmp/mine"}
    assert app.local_jvm_tmp_dir(own) == own


def test_the_jvm_temporary_directory_is_given_only_where_this_process_starts_a_local_jvm():
    """No master (pyspark's local[*], as a config without `spark.master` runs) and `local[...]` start their JVM here
    with the executors in it; under spark-submit (PYSPARK_GATEWAY_PORT) or with a cluster master they do not."""
    assert app.starts_local_jvm(None, {})
    assert app.starts_local_jvm("local[2]", {})
    assert not app.starts_local_jvm("k8s://https://10.0.0.1:443", {})
    assert not app.starts_local_jvm(None, {"PYSPARK_GATEWAY_PORT": "40123"})


def test_a_local_checkpoint_gets_the_file_system_checkpoint_manager_and_a_users_own_wins() -> None:
    """A checkpoint on the local file system is written through Spark's `FileSystem`-based manager (no readlink
    process per file status); other file systems, and a manager of the user's own, keep theirs."""
    key, manager = app.CHECKPOINT_MANAGER_KEY, app.FS_CHECKPOINT_MANAGER
    assert app.local_checkpoint_file_manager({}, "/checkpoints/a")[key] == manager
    assert app.local_checkpoint_file_manager({}, "file:///checkpoints/a")[key] == manager
    assert key not in app.local_checkpoint_file_manager({}, "s3a://bucket/checkpoints/a")
    assert key not in app.local_checkpoint_file_manager({}, "hdfs://nn:8020/checkpoints/a")
    assert key not in app.local_checkpoint_file_manager({"spark.hadoop.fs.defaultFS": "hdfs://nn:8020"}, "/ck/a")
    own = {key: "com.example.MyManager"}
    assert app.local_checkpoint_file_manager(own, "/checkpoints/a") == own


def test_an_s3_checkpoint_gets_s3a_settings_from_the_environment_and_never_its_credentials(tmp_path: Path) -> None:
    """The operator's environment becomes `spark.hadoop.fs.s3a.*`; the keys stay in the environment (S3A's default
    chain reads them), executors get them from the same Secret; a key of the user's own wins."""
    (tmp_path / "hadoop-aws-3.5.0.jar").write_bytes(b"")
    env = {"HANDOFF_CHECKPOINT_S3_ENDPOINT": "http://127.0.0.1:9000", "HANDOFF_CHECKPOINT_S3_PATH_STYLE": "true",
           "HANDOFF_CHECKPOINT_CREDENTIALS_SECRET": "ckpt-s3", "AWS_ACCESS_KEY_ID": "AKIA-SECRET",
           "AWS_SECRET_ACCESS_KEY": "very-secret", "HANDOFF_HADOOP_AWS_JARS": str(tmp_path)}
    conf = app.s3_checkpoint_conf({"spark.hadoop.fs.s3a.endpoint.region": "eu-west-1"}, "s3a://b/ckpt", env)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"  # the user's own
    assert conf["spark.kubernetes.executor.secretKeyRef.AWS_ACCESS_KEY_ID"] == "ckpt-s3:AWS_ACCESS_KEY_ID"
    assert conf["spark.executorEnv.HANDOFF_CHECKPOINT_S3_ENDPOINT"] == "http://127.0.0.1:9000"
    assert conf["spark.jars"] == str(tmp_path / "hadoop-aws-3.5.0.jar")
    assert "AKIA-SECRET" not in str(conf) and "very-secret" not in str(conf)
    assert app.CHECKPOINT_MANAGER_KEY not in conf  # Spark's default manager (S3A's AbstractFileSystem)
    # no region given: S3A's own default, us-east-1; a local checkpoint gets nothing
    assert app.s3_checkpoint_conf({}, "s3a://b/ckpt", {})["spark.hadoop.fs.s3a.endpoint.region"] == "us-east-1"
    assert app.s3_checkpoint_conf({}, "file:///ckpt", env) == {}


def test_a_gcs_checkpoint_gets_the_connector_settings_and_only_the_key_files_path(tmp_path: Path) -> None:
    """The operator's environment becomes `spark.hadoop.fs.gs.*` for Google's connector: its classes (Hadoop 3.5's
    core-default names hadoop-gcp's), the sizes core-default writes with units in bytes, the endpoint, and the
    credentials as a key file's path (mounted in executors from the same Secret), never the key."""
    (tmp_path / "gcs-connector-3.1.3-shaded.jar").write_bytes(b"")
    key = tmp_path / "key.json"
    key.write_text('{"private_key": "very-secret"}')
    env = {"HANDOFF_CHECKPOINT_GCS_ENDPOINT": "http://127.0.0.1:4443/", "HANDOFF_CHECKPOINT_CREDENTIALS_SECRET": "ckpt-gcs",
           "GOOGLE_APPLICATION_CREDENTIALS": str(key), "HANDOFF_HADOOP_GCS_JARS": str(tmp_path)}
    conf = app.gcs_checkpoint_conf({"spark.hadoop.fs.gs.block.size": "1048576"}, "gs://b/ckpt", env)
    assert conf["spark.hadoop.fs.gs.impl"] == "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem"
    assert conf["spark.hadoop.fs.AbstractFileSystem.gs.impl"] == "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFS"
    assert conf["spark.hadoop.fs.gs.block.size"] == "1048576"  # the user's own
    assert conf["spark.hadoop.fs.gs.outputstream.buffer.size"] == str(8 << 20)
    assert all(conf[f"spark.hadoop.{k}"].isdigit() for k in app.GCS_SIZES)
    assert conf["spark.hadoop.fs.gs.storage.root.url"] == "http://127.0.0.1:4443"
    assert conf["spark.hadoop.fs.gs.auth.type"] == "SERVICE_ACCOUNT_JSON_KEYFILE"
    assert conf["spark.hadoop.fs.gs.auth.service.account.json.keyfile"] == str(key)
    assert conf["spark.kubernetes.executor.secrets.ckpt-gcs"] == contract.GCS_KEY_DIR
    assert conf["spark.executorEnv.GOOGLE_APPLICATION_CREDENTIALS"] == str(key)
    assert conf["spark.jars"] == str(tmp_path / "gcs-connector-3.1.3-shaded.jar")
    assert "very-secret" not in str(conf)
    anonymous = app.gcs_checkpoint_conf({}, "gs://b/ckpt", {"HANDOFF_CHECKPOINT_GCS_ANONYMOUS": "true"})
    assert anonymous["spark.hadoop.fs.gs.auth.type"] == "UNAUTHENTICATED"
    assert anonymous["spark.executorEnv.HANDOFF_CHECKPOINT_GCS_ANONYMOUS"] == "true"
    # nothing said: the pod's own identity (GKE workload identity); an S3 or local checkpoint gets nothing of this
    assert app.gcs_checkpoint_conf({}, "gs://b/ckpt", {})["spark.hadoop.fs.gs.auth.type"] == "APPLICATION_DEFAULT"
    assert app.gcs_checkpoint_conf({}, "s3a://b/ckpt", env) == {}
    assert app.s3_checkpoint_conf({}, "gs://b/ckpt", env) == {}


def test_the_file_system_checkpoint_manager_is_in_pysparks_jars() -> None:
    """The class is named by string; Spark fails every query if it moved (it did, between Spark 3 and 4)."""
    import zipfile

    import pyspark

    jars = list((Path(pyspark.__file__).parent / "jars").glob("spark-sql_*.jar"))
    assert jars
    entry = app.FS_CHECKPOINT_MANAGER.replace(".", "/") + ".class"
    assert any(entry in zipfile.ZipFile(jar).namelist() for jar in jars)


def test_the_warm_up_queries_directories_are_the_drivers_own_and_go_when_done(tmp_path: Path, monkeypatch) -> None:
    """A driver killed in a warm-up left its query's checkpoint in /tmp for good (tempfile's directories carry no
    owner); now the next driver removes it (temp_dirs)."""
    from handoff_spark.startup import executor_warmup
    from handoff_spark.startup import session_warmup
    from handoff_spark.driver import temp_dirs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()
    for prefix in (session_warmup.DIR_PREFIX, executor_warmup.DIR_PREFIX):
        left = tmp_path / f"{prefix}{gone.pid}-abc123"
        left.mkdir()
        with temp_dirs.own_temp_dir_while(prefix) as mine:
            assert Path(mine).name.startswith(f"{prefix}{os.getpid()}-") and Path(mine).is_dir()
            assert not left.exists()
        assert not Path(mine).exists()


def test_temporary_files_made_while_the_session_starts_are_in_the_drivers_own_directory(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """PySpark's JVM launch keeps a `tempfile` directory until the JVM answers: a driver killed then left it in /tmp
    for good. During the launch `tempfile` makes everything in a directory named by the driver's pid, which the
    next driver removes, and it is gone once the launch is done."""
    from handoff_spark.driver import temp_dirs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = tmp_path / f"{app.LAUNCH_TMP_PREFIX}{gone.pid}-abc123"
    (left / "tmpconninfo").mkdir(parents=True)
    with temp_dirs.tempfile_dir_while(app.LAUNCH_TMP_PREFIX) as mine:
        made = Path(tempfile.mkdtemp())  # as pyspark.java_gateway.launch_gateway does
        assert made.parent == Path(mine) and Path(mine).name.startswith(f"{app.LAUNCH_TMP_PREFIX}{os.getpid()}-")
        assert not left.exists()
    assert tempfile.gettempdir() == str(tmp_path) and not Path(mine).exists()
