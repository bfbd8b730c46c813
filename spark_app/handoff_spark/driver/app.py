"""The driver: one Structured Streaming query `handoff-kafka` → table sink, run from an AppConfig.

`python -m handoff_spark run --config app.json [--available-now]` is what the driver pod runs (the operator
renders app.json; spark-submit supplies master/executor conf) and what `handoff run -f manifest.yaml` runs
locally (the config then carries `spark.master=local[N]`).

Why a graceful stop is built in: the operator restarts drivers for upgrades and rescaling by sending SIGTERM.
Stopping mid-batch would be safe (the sink skips replayed batches) but wasteful, so on SIGTERM/SIGINT the app
tells the source to admit no new data (a stop-marker file the source checks in `latestOffset`), lets the
running batch commit, stops the query at that batch boundary and exits 0. A second signal stops at once.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlparse

from handoff_spark import contract, switches
from handoff_spark.startup import jvm_cds
from handoff_spark.startup import fork_server, local_fs, session_warmup, worker_daemon
from handoff_spark.startup.early_session import EarlySession
from handoff_spark.sink import registry as sinks
from handoff_spark.config import AppConfig
from handoff_spark.contract import (CONFIG_COMMITTED_KEY, CONFIG_HASH_KEY, CONFIG_REFUSED_HASH_KEY, CONFIG_REFUSED_KEY,
                                   CONFIG_SINCE_KEY, QUERY_HELD_KEY, QUERY_HOLDING_KEY, TRANSFORM_INVALID_EXIT)
from handoff_spark.errors import HandoffConfigError
from handoff_spark.sink.common import SchemaIncompatibleError
from handoff_spark.kafka.source import (RANGES_SOURCE_NAME, SOURCE_NAME, HandoffKafkaDataSource, HandoffKafkaRangesDataSource,
                           source_options)
from handoff_spark.driver.progress import (BatchReport, Metrics, read_commit, read_initial_offsets,
                       report_from_progress, write_progress_file, Totals)
from handoff_spark.driver.executor_scaler import ExecutorScaler
from handoff_spark.driver.hold import QueryHold
from handoff_spark.driver.publisher import ProgressPublisher
from handoff_spark.driver.resume import SourceInvalid, StartPlan, prepare_start, settle_key_types, source_problem
from handoff_spark.driver.temp_dirs import own_temp_dir, tempfile_dir_while
from handoff_spark import checkpoint as ckpt
from handoff_spark.driver import quarantine, query_config, seed, table_wait, transform
from handoff_spark.sink.frames import SOURCE_NAME as FRAMES_SOURCE_NAME, FramesDataSource

log = logging.getLogger("handoff.app")

#: Default `minPartitions` = this × Spark's default parallelism (its cores): 3 equal partitions on 2 cores
#: become 6 tasks in 3 full waves instead of 3 tasks in 2 waves with one core idle in the second.
MIN_PARTITIONS_PER_CORE = 3

#: Sinks whose write task reads its Kafka ranges itself (`handoff-kafka-ranges`, the fused path): records never
#: cross Python → JVM → Python. `HANDOFF_FUSED_READ=0` falls back to the record source (for comparison).
FUSED_SINKS = frozenset({"iceberg", "bigquery"})


#: The driver's and executors' JVMs compile with C1 only. Why: Handoff's JVMs move offset ranges, commit messages and
#: Spark's own bookkeeping, never records (the fused path reads, decodes and writes in Python), so C2's faster
#: code buys little, while C2 itself kept compiling in every query: 0.3–0.5 s of CPU per AvailableNow query on a
#: warm session, on a 2-core node a quarter of a core taken from the write tasks for the whole batch
#: (docs/benchmarks.md, "Throughput"). `HANDOFF_JVM_C1_ONLY=0`, or a `-XX:TieredStopAtLevel` / `TieredCompilation`
#: option of the user's own in sparkConf, keeps the JVM's default.
C1_ONLY_OPTION = "-XX:TieredStopAtLevel=1"


def jit_options(conf: dict[str, str]) -> dict[str, str]:
    """`conf` with `C1_ONLY_OPTION` appended to the driver's and executors' JVM options (see there)."""
    if not switches.JVM_C1_ONLY():
        return conf
    out = dict(conf)
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        existing = out.get(key, "")
        if "TieredStopAtLevel" not in existing and "TieredCompilation" not in existing:
            out[key] = " ".join(x for x in (existing, C1_ONLY_OPTION) if x)
    return out


#: The checkpoint file manager for a checkpoint on the local file system (`local_checkpoint_file_manager`).
CHECKPOINT_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
FS_CHECKPOINT_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def local_checkpoint_file_manager(conf: dict[str, str], checkpoint_location: str) -> dict[str, str]:
    """`conf` with Spark's `FileSystem`-based checkpoint file manager when the checkpoint is on the local file
    system (a `file:` location, or one without a scheme and no other `spark.hadoop.fs.defaultFS`), unless the user
    chose a manager.

    Why: Spark's default manager goes through Hadoop's `FileContext`, whose local file system (without the native
    libhadoop, which pyspark's jars lack) runs a `readlink` process for every file status it takes: 24 processes
    per AvailableNow query; measured on a local[2] driver, walCommit 55–80 → 13–29 ms and commitOffsets 75–120 →
    17–53 ms per batch. Through `FileSystem`, file status is Java's own and no readlink is spawned (the `chmod`s
    of new files and directories remain: both managers set permissions through Hadoop's local file system).

    Why it is safe: both managers write a log file the same way (a hidden temporary file in the same directory,
    then a rename; same `.crc` files, so existing checkpoints read alike) and on the local file system both
    renames come down to the same check that the target does not exist, then rename(2), which atomically puts the
    complete file in place. Other file systems (HDFS, object stores) keep Spark's default."""
    default_fs = conf.get("spark.hadoop.fs.defaultFS", "file:///")
    scheme = urlparse(checkpoint_location).scheme or urlparse(default_fs).scheme
    if CHECKPOINT_MANAGER_KEY in conf or scheme != "file":
        return conf
    return {**conf, CHECKPOINT_MANAGER_KEY: FS_CHECKPOINT_MANAGER}


def s3_checkpoint_conf(conf: dict[str, str], checkpoint_location: str,
                       env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`conf` with what Spark's S3A file system needs for a checkpoint on S3 (`s3a://`), from the environment the
    operator renders (switches.CHECKPOINT_S3_*); a key the user set in sparkConf wins. The jars: pyspark's own
    jars directory in the image, `switches.HADOOP_AWS_JARS` for a local run.

    Why through the environment and not the app config: Handoff's own checkpoint files (`handoff_spark.checkpoint`,
    read and written by the driver and by Python workers) need the same endpoint, and workers inherit the driver's
    environment. Credentials are never put into Spark's conf (it is shown in the UI and logs): S3A's default chain
    reads AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY from the environment, and executor pods get them from the same
    Secret through `spark.kubernetes.executor.secretKeyRef.*`. The checkpoint file manager stays Spark's default
    (FileContext-based, S3A's `AbstractFileSystem`): `local_checkpoint_file_manager`'s shortcut is for local disks."""
    if urlparse(checkpoint_location).scheme != "s3a":
        return conf
    out = dict(conf)
    endpoint, region, path_style = ckpt.s3_settings(env)
    settings = {"spark.hadoop.fs.s3a.endpoint.region": region}
    if endpoint:
        settings["spark.hadoop.fs.s3a.endpoint"] = endpoint
        settings["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(endpoint.startswith("https://")).lower()
    if path_style:
        settings["spark.hadoop.fs.s3a.path.style.access"] = path_style
    # Python workers on executor pods read Handoff's side files with the same settings (frame counts).
    for switch in (switches.CHECKPOINT_S3_ENDPOINT, switches.CHECKPOINT_S3_PATH_STYLE, switches.CHECKPOINT_S3_REGION):
        if switch(env):
            settings[f"spark.executorEnv.{switch.name}"] = switch(env)  # type: ignore[assignment]
    secret = switches.CHECKPOINT_CREDENTIALS_SECRET(env)
    if secret:
        for key in contract.CHECKPOINT_CREDENTIAL_KEYS:
            settings[f"spark.kubernetes.executor.secretKeyRef.{key}"] = f"{secret}:{key}"
    _add_jars(out, switches.HADOOP_AWS_JARS, env)
    for key, value in settings.items():
        out.setdefault(key, value)
    return out


def _add_jars(conf: dict[str, str], switch: switches.Text, env: Mapping[str, str] | None) -> None:
    """The jars of the directory `switch` names appended to `spark.jars` (a local run; the image has them)."""
    jars_dir = switch(env)
    if jars_dir:
        jars = sorted(str(p) for p in Path(jars_dir).glob("*.jar"))
        if not jars:
            raise SystemExit(f"{switch.as_set(env)} holds no jars (hack/handoff_testbed/jars.py)")
        conf["spark.jars"] = ",".join(x for x in (conf.get("spark.jars", ""), *jars) if x)


#: Google's GCS connector (gcs-connector, shaded), for a `gs://` checkpoint.
GCS_FILE_SYSTEM = "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem"
GCS_ABSTRACT_FILE_SYSTEM = "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFS"
#: Sizes the connector reads as plain numbers, which Hadoop 3.5's core-default.xml sets with units (`64m`) for
#: Hadoop's own hadoop-gcp: unset, the connector fails at its first call with NumberFormatException. Hadoop's
#: defaults, in bytes.
GCS_SIZES = {"fs.gs.block.size": 64 << 20, "fs.gs.rewrite.max.chunk.size": 512 << 20,
             "fs.gs.outputstream.buffer.size": 8 << 20, "fs.gs.inputstream.inplace.seek.limit": 8 << 20,
             "fs.gs.inputstream.min.range.request.size": 2 << 20}


def gcs_checkpoint_conf(conf: dict[str, str], checkpoint_location: str,
                        env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`conf` with what Google's GCS connector needs for a checkpoint on Google Cloud Storage (`gs://`), from the
    environment the operator renders (switches.CHECKPOINT_GCS_*, GOOGLE_APPLICATION_CREDENTIALS); a key the user
    set in sparkConf wins.

    Why Google's gcs-connector and not Hadoop 3.5's own hadoop-gcp (which core-default.xml names for `gs:`):
    hadoop-gcp 3.5.0 has no setting for the storage endpoint, so it can reach nothing but Google (no emulator, no
    private endpoint) and could not be tested here; the connector (`fs.gs.storage.root.url`) can, and is what
    Dataproc runs. Credentials: a key file (the Secret the operator mounts, also in executor pods through
    `spark.kubernetes.executor.secrets.*`), none for `anonymous`, else the pod's own identity (APPLICATION_DEFAULT:
    GKE's workload identity). The key itself is never in Spark's conf, only its path."""
    if urlparse(checkpoint_location).scheme != "gs":
        return conf
    out = dict(conf)
    endpoint, anonymous = ckpt.gcs_settings(env)
    key_file = switches.GOOGLE_APPLICATION_CREDENTIALS(env)
    settings = {"spark.hadoop.fs.gs.impl": GCS_FILE_SYSTEM,
                "spark.hadoop.fs.AbstractFileSystem.gs.impl": GCS_ABSTRACT_FILE_SYSTEM,
                **{f"spark.hadoop.{key}": str(value) for key, value in GCS_SIZES.items()}}
    if endpoint:
        settings["spark.hadoop.fs.gs.storage.root.url"] = endpoint.rstrip("/")
        settings[f"spark.executorEnv.{switches.CHECKPOINT_GCS_ENDPOINT.name}"] = endpoint
    if anonymous:
        settings["spark.hadoop.fs.gs.auth.type"] = "UNAUTHENTICATED"
        settings[f"spark.executorEnv.{switches.CHECKPOINT_GCS_ANONYMOUS.name}"] = "true"
    elif key_file:
        settings["spark.hadoop.fs.gs.auth.type"] = "SERVICE_ACCOUNT_JSON_KEYFILE"
        settings["spark.hadoop.fs.gs.auth.service.account.json.keyfile"] = key_file
        settings[f"spark.executorEnv.{switches.GOOGLE_APPLICATION_CREDENTIALS.name}"] = key_file
    else:
        settings["spark.hadoop.fs.gs.auth.type"] = "APPLICATION_DEFAULT"
    secret = switches.CHECKPOINT_CREDENTIALS_SECRET(env)
    if secret and not anonymous:
        settings[f"spark.kubernetes.executor.secrets.{secret}"] = contract.GCS_KEY_DIR
    _add_jars(out, switches.HADOOP_GCS_JARS, env)
    for key, value in settings.items():
        out.setdefault(key, value)
    return out


#: A cluster driver's shuffle partitions when the operator named none (contract.SHUFFLE_PARTITIONS_CONF: a driver
#: started by an operator before it did, or `handoff run` against a cluster master).
FRAME_SHUFFLE_PARTITIONS = 8
STATE_STORE_KEY = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB_STATE_STORE = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
ROCKSDB_TRACK_ROWS_KEY = "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows"
ROCKSDB_CHANGELOG_KEY = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
NO_DATA_BATCHES_KEY = "spark.sql.streaming.noDataMicroBatches.enabled"
ARROW_MAX_BYTES_KEY = "spark.sql.execution.arrow.maxBytesPerBatch"
ARROW_MAX_BYTES = "2147483647"
ADAPTIVE_KEY = "spark.sql.adaptive.enabled"


def local_cores(master: str | None) -> int | None:
    """The cores of a local master (`local`, `local[N]`, `local[N,F]`; `local[*]`: the CPUs this process may run
    on), None for any other master (a cluster's executors come and go)."""
    m = _LOCAL_MASTER.fullmatch((master or "").strip())
    if m is None:
        return None
    n = m.group(1)
    if n is None:
        return 1
    return len(os.sched_getaffinity(0)) if n == "*" else max(1, int(n))


_LOCAL_MASTER = re.compile(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?")


def cluster_partitions(conf: Mapping[str, str]) -> int:
    """The shuffle partitions the operator named for this handoff (`contract.SHUFFLE_PARTITIONS_CONF`: the most
    executor cores it may scale to), else FRAME_SHUFFLE_PARTITIONS; a value that is not a positive count counts as
    none (the key is the operator's, so this is a fallback, not a user's error)."""
    value = str(conf.get(contract.SHUFFLE_PARTITIONS_CONF) or "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else FRAME_SHUFFLE_PARTITIONS


def frame_path_conf(conf: dict[str, str], cfg: AppConfig, partitions: int | None = None) -> dict[str, str]:
    """`conf` with what the DataFrame path's stateful query needs; a user's own setting wins, and once a query has
    started, its checkpoint's (Spark keeps both keys in the offset log). The fused path gets neither. `partitions`:
    the shuffle's, a local master's cores (`local_cores`); None: a cluster's (`cluster_partitions(conf)`).

    - Shuffle partitions: fixed in the checkpoint at the first start (a dedupe's state is partitioned by them, and
      Spark cannot split it later); Spark's 200 would make every batch 200 tasks on any node, for ever. Each
      partition is a task, a state store and a writer with its own files per batch: 8 on 2 cores made a stream's
      dedupe batches 14-44 % slower (docs/benchmarks.md, "The shuffle's partitions on a local master"), while
      fewer than the cores a handoff scales up to leave its added executors without dedupe work. So as many as
      the cores it can ever have: a local master's (`make demo`, a Backfill Job's pod), or on a cluster the
      operator's scaling.maxExecutors × spark.executor.cores (`cluster_partitions`).
    - A dedupe's state in RocksDB, off the heap: a window of keys in Spark's default heap store ran a 1 GiB
      executor out of memory at 1M keys (docs/design/spark-data-path.md).
    - Without RocksDB's count of the state's rows: keeping it reads every key again before each put and remove,
      and the dedupe already reads each key once. Its only use is the state operator's `numRowsTotal` in the
      query's progress, which Handoff does not report. Measured on the dedupe: 3-14 % less time, 14-24 % less
      JVM task CPU (docs/benchmarks.md, "RocksDB without its row count").
    - RocksDB's changelog checkpointing: a batch's state commit writes the batch's changes, and snapshots are made
      in the background, instead of a snapshot of every store at every commit. Measured: the state commits of a
      batch 9-57 ms instead of 370-436 ms (8 stores, summed), a batch 5-20 % faster (docs/benchmarks.md, "A
      dedupe's batches as its window fills"). Spark switches an existing checkpoint to it, and back, by itself."""
    if not cfg.frame_path:
        return conf
    out = dict(conf)
    out.setdefault("spark.sql.shuffle.partitions", str(partitions or cluster_partitions(conf)))
    if cfg.dedupe is not None:
        out.setdefault(STATE_STORE_KEY, ROCKSDB_STATE_STORE)
        out.setdefault(ROCKSDB_TRACK_ROWS_KEY, "false")
        out.setdefault(ROCKSDB_CHANGELOG_KEY, "true")
    return out


def no_data_batches(cfg: AppConfig, waiting_operators: list[str]) -> bool:
    """Whether a DataFrame-path query needs Spark's no-data batches; `waiting_operators`: the transform's operators
    whose output waits on the watermark (`pyspark_private.watermark_output_operators`).

    Why not always: after the data stops (a stream going quiet, the end of an AvailableNow run) Spark runs one more
    batch only for its stateful operators. When the dedupe is the only one (`dropDuplicatesWithinWatermark` emits
    each row at once; lateness is judged in the read tasks from the offset log's watermark, `sink.frames`), that
    batch emits nothing and decides nothing: it evicts the keys whose window has passed, which the next data batch
    does too, under the same watermark. It costs a whole batch (a task on every state store, the sink's empty commit
    with a catalog read): 0.14 s of a 2 s AvailableNow run of 300,000 records (docs/benchmarks.md, "Without the
    no-data batch"). A transform that aggregates, or joins the stream with itself, keeps them: its output waits on
    them."""
    return cfg.dedupe is None or bool(waiting_operators)


def set_no_data_batches(spark: Any, cfg: AppConfig, df: Any) -> None:
    """The session's `NO_DATA_BATCHES_KEY` for the query about to start over `df` (`no_data_batches`), set at every
    start since a query switched in this driver may need the other value; a user's own setting wins."""
    if NO_DATA_BATCHES_KEY in cfg.spark_conf:
        return
    from handoff_spark.pyspark_private import watermark_output_operators

    waiting = watermark_output_operators(df) if cfg.dedupe is not None and cfg.transform is not None else []
    spark.conf.set(NO_DATA_BATCHES_KEY, str(no_data_batches(cfg, waiting)).lower())


def set_frame_path_conf(spark: Any, cfg: AppConfig) -> None:
    """The session's SQL settings of `frame_path_conf` (those the user did not set), set before a DataFrame-path query
    starts. A session built for it has them already; one built for the fused path (the pod started without a
    transform, dedupe or event time, and one was added since: the query switched in this driver, driver.query_config)
    gets them now. They are SQL settings a new query reads at its start, and its checkpoint keeps them after."""
    master = str(spark.sparkContext.master)
    partitions = (spark.sparkContext.defaultParallelism if local_cores(master) is not None
                  else cluster_partitions(cfg.spark_conf))
    for key, value in frame_path_conf({}, cfg, partitions).items():
        if key not in cfg.spark_conf and spark.conf.get(key, None) != value:
            spark.conf.set(key, value)


def build_session(cfg: AppConfig) -> Any:
    """SparkSession from `cfg.spark_conf` (spark-submit's conf wins where it already set a key)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    use_fork_server(cfg)  # first: its imports overlap the JVM's launch
    builder = SparkSession.builder.appName(f"handoff-{cfg.handoff_id.replace('/', '.')}")
    conf = jvm_cds.apply(dict(cfg.spark_conf))  # Spark's classes from a CDS archive when one is installed
    if not cfg.frame_path:  # on the DataFrame path the JVM moves records: C2 pays (spark-data-path.md)
        conf = jit_options(conf)
    # Spark checks an Arrow batch's byte size after every row it hands a Python worker unless this is
    # Int.MaxValue, quadratic for a list column: ~22x of the record path's time (docs/design/spark-data-path.md).
    # Batches stay bounded by spark.sql.execution.arrow.maxRecordsPerBatch.
    conf.setdefault(ARROW_MAX_BYTES_KEY, ARROW_MAX_BYTES)
    # Spark runs no streaming query adaptively, and says so in a WARN line at every query's start (the stream's and
    # the warm-up's: two per driver start). The driver's Spark runs streaming queries and the warm-ups' tiny writes,
    # so the setting is off instead of warned about. A user's own value wins.
    conf.setdefault(ADAPTIVE_KEY, "false")
    conf = local_checkpoint_file_manager(conf, cfg.checkpoint_location)
    # Hadoop's `file:` system without a chmod process per file it writes (a local checkpoint's logs and state).
    conf = local_fs.conf(conf, jvm_cds.spark_jars_dir())
    conf = s3_checkpoint_conf(conf, cfg.checkpoint_location)
    conf = gcs_checkpoint_conf(conf, cfg.checkpoint_location)
    # Workers fork from a daemon that has already imported pyarrow, confluent-kafka and the sink's write path.
    conf.setdefault("spark.python.daemon.module", "handoff_spark.startup.worker_daemon")
    conf.setdefault(f"spark.executorEnv.{worker_daemon.SINK_ENV}", cfg.sink.kind)  # what the daemon preloads
    master = conf.pop("spark.master", None) or switches.SPARK_MASTER()
    if starts_local_jvm(master, os.environ):
        conf = local_jvm_tmp_dir(conf)
    conf = frame_path_conf(conf, cfg, local_cores(master or "local[*]"))  # no master: pyspark's local[*]
    if master is None or master.startswith("local"):
        conf.setdefault("spark.ui.showConsoleProgress", "false")
    if master:
        builder = builder.master(master)
        if master.startswith("local"):
            conf.setdefault("spark.ui.enabled", "false")
            conf.setdefault("spark.ui.showConsoleProgress", "false")
            conf.setdefault("spark.sql.shuffle.partitions", "2")
            conf.setdefault("spark.driver.host", "127.0.0.1")
            conf.setdefault("spark.driver.bindAddress", "127.0.0.1")
    for key, value in conf.items():
        builder = builder.config(key, value)
    with tempfile_dir_while(LAUNCH_TMP_PREFIX):  # PySpark's launch files: removed by the next driver if killed now
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(switches.SPARK_LOG_LEVEL())
    register_data_sources(spark, cfg)
    return spark


#: The driver's fork server (`startup.fork_server`), started by its first session; later sessions of the process
#: (a test's, a bench's) use it too, or one started for their sink. Stopped when the process exits.
_fork_server: fork_server.ForkServer | None = None
FORK_DIR_PREFIX = "handoff-fork-"


def use_fork_server(cfg: AppConfig) -> str | None:
    """Start the fork server (once per process) and make its launcher Spark's Python (`SPARK_PYTHON_VARS`), where the
    session about to be built starts its own JVM and either runs its executors in it or has executor pods of this
    image (`fork_server_launcher`), and Spark's Python is this interpreter (a user's own `PYSPARK_PYTHON` wins; so
    does `HANDOFF_FORK_SERVER=0`, and a user's own `PYSPARK_DRIVER_PYTHON`). Returns the launcher, or None."""
    global _fork_server
    master = cfg.spark_conf.get("spark.master") or switches.SPARK_MASTER()
    launcher = fork_server_launcher(master, cfg.spark_conf, os.environ)
    if not switches.FORK_SERVER() or launcher is None:
        if _fork_server is not None:  # an earlier session's launcher: this one runs without it
            os.environ.update({name: sys.executable for name, value in os.environ.items()
                               if name in SPARK_PYTHON_VARS and value == _fork_server.launcher})
        return None
    previous = _fork_server.launcher if _fork_server is not None else None
    if _fork_server is None or _fork_server.process.poll() is not None or _fork_server.sink != cfg.sink.kind:
        current = os.environ.get("PYSPARK_PYTHON")
        if not (runs_this_python(current) or (_fork_server is not None and current == _fork_server.launcher)):
            return None
        if _fork_server is not None:  # another sink's (a test process's sessions): its preloads are not this one's
            _fork_server.stop()
            atexit.unregister(_fork_server.stop)
            _fork_server = None
        directory = own_temp_dir(FORK_DIR_PREFIX)
        try:
            _fork_server = fork_server.start(directory, cfg.sink.kind, launcher or None)
        except OSError as exc:  # a temporary directory too long for a socket's path, or noexec: Spark's own way
            log.warning("Spark's Python processes start as fresh interpreters: no fork server (%s)", exc)
            shutil.rmtree(directory, ignore_errors=True)
            os.environ["PYSPARK_PYTHON"] = sys.executable
            if previous is not None and os.environ.get("PYSPARK_DRIVER_PYTHON") == previous:
                os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
            return None
        atexit.register(_fork_server.stop)
        log.info("Spark's Python processes fork from a server (pid %d, Spark's Python %s)",
                 _fork_server.process.pid, _fork_server.launcher)
    os.environ[switches.FORK_SOCKET.name] = _fork_server.socket  # for the image's launcher (the JVM inherits it)
    os.environ["PYSPARK_PYTHON"] = _fork_server.launcher
    driver_python = os.environ.get("PYSPARK_DRIVER_PYTHON")
    if runs_this_python(driver_python) or driver_python in (previous, _fork_server.launcher):
        os.environ["PYSPARK_DRIVER_PYTHON"] = _fork_server.launcher
    return _fork_server.launcher


#: The variables a local JVM takes Spark's Python from. Python functions and data sources carry pyspark's
#: `sc.pythonExec` (`PYSPARK_PYTHON`). The data-source lookup that Spark runs once per JVM, at a session's first
#: data-source call (`app.register_data_sources`, inside the session's start), takes the JVM's own
#: `PythonUtils.defaultPythonExec`: `PYSPARK_DRIVER_PYTHON` first. With that left at the interpreter, the lookup was
#: the one process of a restart's chain that still started a fresh interpreter and imported pyspark (~0.3 s of the
#: session's start, traced: docs/benchmarks.md, "Cold start", session 49). The Python driver itself is
#: already running, so the variable has no other use in this process or its JVM.
SPARK_PYTHON_VARS = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")


#: Spark on Kubernetes' image of the driver and executors, and the executors' own when it is not the driver's.
IMAGE_KEY, EXECUTOR_IMAGE_KEY = "spark.kubernetes.container.image", "spark.kubernetes.executor.container.image"


def fork_server_launcher(master: str | None, conf: Mapping[str, str], env: Mapping[str, str]) -> str | None:
    """Which launcher a fork server would use: the image's (`HANDOFF_FORK_LAUNCHER`, when it is a runnable file),
    else `""` for one written into the server's directory; None where there can be no fork server.

    A local master: either. A `k8s://` master: only the image's, and only when the executors run the driver's image
    (`spark.kubernetes.executor.container.image` unset or the same), since every executor runs it as its Python
    (it runs the real interpreter there). Neither when spark-submit started this Python (its JVM is already up)."""
    image_launcher = switches.FORK_LAUNCHER(env)
    usable = image_launcher if image_launcher and os.access(image_launcher, os.X_OK) else None
    if starts_local_jvm(master, env):
        return usable or ""
    executor_image = conf.get(EXECUTOR_IMAGE_KEY)
    same_image = executor_image is None or executor_image == conf.get(IMAGE_KEY)
    if master and master.startswith("k8s://") and starts_own_jvm(env) and same_image:
        return usable
    return None


def runs_this_python(value: str | None) -> bool:
    """Whether `PYSPARK_PYTHON` = `value` is this interpreter: unset, its path, or a name the PATH finds beside it as
    the same file (the image's `python3` in its virtualenv). Anything else is the user's own choice."""
    if not value or value == sys.executable:
        return True
    found = shutil.which(value)
    return (found is not None and os.path.dirname(os.path.abspath(found)) == os.path.dirname(sys.executable)
            and os.path.samefile(found, sys.executable))


def register_data_sources(spark: Any, cfg: AppConfig) -> None:
    spark.dataSource.register(HandoffKafkaDataSource)
    spark.dataSource.register(HandoffKafkaRangesDataSource)
    spark.dataSource.register(FramesDataSource)
    try:
        spark.dataSource.register(sinks.get(cfg.sink.kind).data_source)
    except sinks.SinkUnavailable as exc:
        raise SystemExit(str(exc)) from exc


def uses_fused_read(cfg: AppConfig, sink_format: str | None = None) -> bool:
    """The configured sink reads its ranges itself (the default for both table sinks)."""
    return (sink_format is None and cfg.sink.kind in FUSED_SINKS
            and switches.FUSED_READ())


def start_query(spark: Any, cfg: AppConfig, *, available_now: bool = False, stop_marker: str | None = None,
                sink_format: str | None = None, start_offsets: dict[str, dict[int, int]] | None = None,
                min_partitions_file: str | None = None) -> Any:
    """Start the query. `sink_format` overrides the configured sink (e.g. `noop`, `memory` for tests/bench);
    those always get the record source. `start_offsets`: the table ledger's end (where a fresh checkpoint starts).
    `min_partitions_file`: rewritten when the executors change (executor_scaler), so each batch is split for the
    cores there are now; unused when the spec sets `minPartitions` itself."""
    frames = frames_query(cfg, sink_format)
    if frames:
        set_frame_path_conf(spark, cfg)
    reader = spark.readStream.format(FRAMES_SOURCE_NAME if frames else
                                     RANGES_SOURCE_NAME if uses_fused_read(cfg, sink_format) else SOURCE_NAME)
    options = source_options(cfg, stop_marker, start_offsets)
    seed_line = ckpt.read_seed_line(cfg.checkpoint_location) if frames else {}
    if frames:
        options["config"] = cfg.to_json()
        if seed_line:
            options["seedLine"] = ckpt.seed_line_json(seed_line)
    # Enough tasks per batch to keep every core busy when topic-partitions are few or do not divide evenly
    # over the cores (kafka.source.split_ranges; small batches stay one task per partition).
    if "minPartitions" not in options and min_partitions_file:
        options["minPartitionsFile"] = min_partitions_file
    options.setdefault("minPartitions", str(MIN_PARTITIONS_PER_CORE * spark.sparkContext.defaultParallelism))
    for key, value in options.items():
        reader = reader.option(key, value)
    df = reader.load()
    if frames:  # records as Spark rows: the SQL, event time and dedupe run in Spark (driver.transform)
        df = transform.pipeline(spark, cfg, df)
        set_no_data_batches(spark, cfg, df)
    if sink_format is None:
        writer = df.writeStream.format(sinks.get(cfg.sink.kind).format).option("config", cfg.to_json())
        if frames:
            writer = writer.option("rows", "true")
            if seed_line:
                writer = writer.option("seedLine", ckpt.seed_line_json(seed_line))
    else:
        writer = df.writeStream.format(sink_format)
        if sink_format == "memory":
            writer = writer.queryName(cfg.query_name)
    writer = writer.option("checkpointLocation", cfg.checkpoint_location)
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif cfg.trigger_interval_seconds > 0:
        writer = writer.trigger(processingTime=f"{cfg.trigger_interval_seconds} seconds")
    return writer.start()


def idle_progress(data: dict[str, Any]) -> bool:
    """True for the progress Spark adds while a query waits for data (every
    `spark.sql.streaming.noDataProgressEventInterval`, 10 s): no batch ran, yet it carries the id of the
    batch that will run next. Reported as that batch, it hid the real one (same id, skipped as seen): after
    any idle spell the driver's console, metrics and progress record showed "0 rows" for a batch that wrote
    thousands, and the operator never got a batch to rate an executor by (CI: the in-cluster scaling test
    held at NoMeasurement). A batch that ran has read offset ranges and has Spark's `addBatch` duration."""
    return not data.get("numInputRows") and "addBatch" not in (data.get("durationMs") or {})


def _progress_dict(progress: Any) -> dict[str, Any] | None:
    """A StreamingQueryProgress (PySpark's object, its JSON, or a dict) as a dict; None stays None."""
    if progress is None:
        return None
    data = progress.jsonValue() if hasattr(progress, "jsonValue") else progress
    return json.loads(data) if isinstance(data, str) else data


class ProgressReporter:
    """Turns each finished micro-batch into a console line, a progress-file rewrite and metrics.

    Why polling `query.recentProgress` rather than a StreamingQueryListener: listener events are delivered
    asynchronously through py4j and the last ones are lost when an AvailableNow query ends and the driver
    exits; the progress list is synchronous and still readable after the query terminated.
    """

    def __init__(self, cfg: AppConfig, metrics: Metrics | None, echo: Callable[[str], None],
                 publisher: ProgressPublisher | None = None, checkpoint_discarded: str | None = None) -> None:
        self.cfg, self.metrics, self.echo, self.publisher = cfg, metrics, echo, publisher
        #: Why this driver discarded its checkpoint at start (it then resumed from the table's ledger).
        self.checkpoint_discarded = checkpoint_discarded
        self.last_batch_id = -1
        self.max_event_time_ms: int | None = None
        self.reports: list[BatchReport] = []
        self.totals = Totals()  # published with every record (the operator's cost figures)
        self.spark_batches = 0  # Spark's batches reported
        #: The seed line of this driver's checkpoint (driver.seed): batches below it are reported as seed batches.
        self.seed_line: dict[tuple[str, int], int] = {}
        #: The operator's config this driver runs, and one it refused (CONFIG_KEYS): in every record it publishes.
        self.config_keys: dict[str, Any] = {}
        #: (batchId, timestamp) of the last progress `poll` looked at: an unchanged one is not read again.
        self._last_seen: tuple[Any, Any] | None = None
        #: The newest record published, which a hold's acknowledgement republishes with `QUERY_HELD_KEY`.
        self._record: dict[str, Any] | None = None

    def new_query(self, checkpoint_discarded: str | None, seed_line: dict[tuple[str, int], int]) -> None:
        """A query started again in this driver (after a hold): its checkpoint may be a fresh one whose batch ids
        start at 0 again, so batches are followed from scratch; the totals and the driver's first batch stay."""
        if self.metrics is not None:
            self.metrics.query_held.labels(self.cfg.handoff_id).set(0)
        self.last_batch_id, self._last_seen = -1, None
        self.checkpoint_discarded, self.seed_line = checkpoint_discarded, seed_line
        if self._record is not None and HOLD_KEYS & set(self._record):
            self._offer(self._base())

    def holding(self, request: str) -> None:
        """Say that the query is being stopped for the operator's hold `request`: a batch may still run (published
        at once; the operator waits for `held` rather than stop the pod)."""
        self._offer({**self._base(), QUERY_HOLDING_KEY: request})

    def held(self, request: str) -> None:
        """Say that the query is stopped under the operator's hold `request` (published at once)."""
        if self.metrics is not None:
            self.metrics.query_held.labels(self.cfg.handoff_id).set(1)
        self._offer({**self._base(), QUERY_HELD_KEY: request})

    def config(self, config_hash: str, since_ms: int, *, changed: bool) -> None:
        """Say which of the operator's configs this driver runs and since when (driver.query_config; published at
        once). `changed`: its query just started with it, so the last batch's snapshot is not this config's (the
        operator counts a config good once its own batch committed): dropped until the next batch, with the config's
        newest commit (`CONFIG_COMMITTED_KEY`); otherwise the query runs on as it did and that commit stays."""
        kept = self.config_keys.get(CONFIG_COMMITTED_KEY)
        self.config_keys = {CONFIG_HASH_KEY: config_hash, CONFIG_SINCE_KEY: since_ms}
        if kept is not None and not changed:
            self.config_keys[CONFIG_COMMITTED_KEY] = kept
        base = self._base()
        if changed:
            base.pop("committedSnapshot", None)
        self._offer(base)

    def degraded(self, reason: str | None, detail: str | None = None) -> None:
        """Say the sink's trouble before any batch (the table's service not answering at start: driver.table_wait)
        and its error in one line, or that it is over (None); published at once, and replaced by the first batch's
        record."""
        self._offer({**self._base(), "degradedReason": reason, "degradedDetail": detail})

    def refused(self, config_hash: str, message: str) -> None:
        """Say that this driver refused the operator's config `config_hash` (its check failed) and why; it keeps
        running the config it ran (published at once)."""
        self.config_keys = {**{k: v for k, v in self.config_keys.items()
                               if k in (CONFIG_HASH_KEY, CONFIG_SINCE_KEY, CONFIG_COMMITTED_KEY)},
                            CONFIG_REFUSED_HASH_KEY: config_hash, CONFIG_REFUSED_KEY: message}
        self._offer(self._base())

    def _base(self) -> dict[str, Any]:
        """The newest record without a hold's keys (or the handoff and its totals before any batch), with the
        config this driver runs."""
        base = self._record or {"handoffId": self.cfg.handoff_id, "totals": self.totals.record()}
        return {**{k: v for k, v in base.items() if k not in HOLD_KEYS and k not in CONFIG_KEYS}, **self.config_keys}

    def _offer(self, record: dict[str, Any]) -> None:
        self._record = record
        if self.publisher is not None:
            self.publisher.offer(record)

    def poll(self, query: Any) -> None:
        """Report the batches that finished since the last poll.

        Reads `query.lastProgress` first and the whole `recentProgress` only when a batch went by unseen
        (more than one finished between two polls, or this driver's first). Why: `recentProgress` serialises
        each of up to 100 retained progresses to JSON in the JVM, one py4j call each: a driver past 100 batches
        spent 8 % of a core on it at two polls a second, idle or not; `lastProgress` is one progress: 0.1 %
        (bench/spark/driver/progress_poll.py, docs/benchmarks.md)."""
        try:
            last = _progress_dict(query.lastProgress)
        except Exception:  # noqa: BLE001 - the JVM side may be shutting down
            return
        if last is None:
            return
        key = (last.get("batchId"), last.get("timestamp"))
        if key == self._last_seen:
            return
        self._last_seen = key
        batch_id = int(last.get("batchId", -1))
        if batch_id <= self.last_batch_id:
            return
        if batch_id == self.last_batch_id + 1 and self.last_batch_id >= 0:
            progresses: list[Any] = [last]
        else:
            try:
                progresses = query.recentProgress
            except Exception:  # noqa: BLE001 - the JVM side may be shutting down
                return
        for progress in progresses:
            data = _progress_dict(progress)
            if data is None or int(data.get("batchId", -1)) <= self.last_batch_id or idle_progress(data):
                continue
            try:
                self._report(data)
            except Exception:  # noqa: BLE001 - a reporting bug must not kill the stream
                log.exception("progress reporting failed")
            self.last_batch_id = int(data["batchId"])

    def _report(self, data: dict[str, Any]) -> None:
        cfg = self.cfg
        first = self.spark_batches == 0
        if first:
            # This driver's first batch pays its start-up costs (fresh Python workers, first Kafka and catalog
            # connections): where its time went, in Spark's own terms (docs/benchmarks.md, "Cold start").
            log.info("first batch %s of this driver: durations (ms) %s", data.get("batchId"),
                     json.dumps(data.get("durationMs") or {}, sort_keys=True))
        self.spark_batches += 1
        report = report_from_progress(data, read_commit(cfg.checkpoint_location, int(data["batchId"])),
                                      self.max_event_time_ms,
                                      initial_offsets=read_initial_offsets(cfg.checkpoint_location),
                                      topics=cfg.source.topics)
        # The operator does not rate an executor's capacity from a batch that paid the driver's start-up.
        line = self.seed_line
        if line and report.end and all(end <= line.get(tp, report.start.get(tp, end)) for tp, end in report.end.items()):
            # The dedupe's window being rebuilt after a lost checkpoint (driver.seed): read, nothing written.
            self._emit(report, {"firstOfDriver": first, "seed": True}, prefix="seed ")
            return
        self._emit(report, {"firstOfDriver": first})

    def _emit(self, report: BatchReport, extra: dict[str, Any], prefix: str = "") -> None:
        cfg = self.cfg
        self.max_event_time_ms = report.max_event_time_ms
        self.reports.append(report)
        self.echo(prefix + report.line())
        if self.metrics is not None:
            self.metrics.observe(report)
        self.totals.add(report)
        record = report.record(cfg.handoff_id)
        record.update(extra)
        record["totals"] = self.totals.record()
        if record.get("committedSnapshot") is not None and CONFIG_HASH_KEY in self.config_keys:
            self.config_keys[CONFIG_COMMITTED_KEY] = record["committedSnapshot"]
        record.update(self.config_keys)
        if self.checkpoint_discarded:
            record["checkpointDiscarded"] = self.checkpoint_discarded
        if cfg.progress_file:
            write_progress_file(cfg.progress_file, record)
        self._offer(record)  # handed to the publisher's thread: the batch never waits for the API server


#: Each driver's directory for its stop and min-partitions markers: `<tmp>/handoff-stop-<pid>-<random>`.
STOP_DIR_PREFIX = "handoff-stop-"
#: A local-mode driver's JVM temporary directory (`java.io.tmpdir`): `<tmp>/handoff-jvm-<pid>-<random>`.
JVM_TMP_PREFIX = "handoff-jvm-"
#: Python's `tempfile` directory while the driver starts its session (`driver.temp_dirs.tempfile_dir_while`).
LAUNCH_TMP_PREFIX = "handoff-launch-"


def marker_dir() -> str:
    """A new directory for this driver's stop and min-partitions markers (`own_temp_dir`)."""
    return own_temp_dir(STOP_DIR_PREFIX)


def starts_local_jvm(master: str | None, env: Mapping[str, str]) -> bool:
    """Whether the session about to be built starts its own JVM (spark-submit did not start this Python: pyspark
    then sets PYSPARK_GATEWAY_PORT) and runs the executors in it (`local…`, or no master: pyspark's `local[*]`)."""
    return (master is None or master.startswith("local")) and starts_own_jvm(env)


def starts_own_jvm(env: Mapping[str, str]) -> bool:
    """Whether the session about to be built launches its JVM (pyspark sets PYSPARK_GATEWAY_PORT in a Python that
    spark-submit started, whose JVM is up already)."""
    return "PYSPARK_GATEWAY_PORT" not in env


def local_jvm_tmp_dir(conf: dict[str, str]) -> dict[str, str]:
    """`conf` with the driver's JVM given its own `java.io.tmpdir` (`own_temp_dir`), unless the user set one.

    Why: in local mode the driver's JVM runs the executors, and lz4-java unpacks its native library into
    `java.io.tmpdir` on first use, deleted only when the JVM exits cleanly: every killed local driver left a
    `liblz4-java-*.so` in /tmp (about ten per test-suite run). In its own directory, the next driver removes it."""
    key = "spark.driver.extraJavaOptions"
    existing = conf.get(key, "")
    if "java.io.tmpdir" in existing:
        return conf
    return {**conf, key: " ".join(x for x in (existing, f"-Djava.io.tmpdir={own_temp_dir(JVM_TMP_PREFIX)}") if x)}


def run(cfg: AppConfig, *, available_now: bool = False, sink_format: str | None = None,
        echo: Callable[[str], None] = print, metrics_port_fallback: bool = False) -> int:
    """Run until AvailableNow drains, a stop signal arrives (exit 0), or the query fails (exit 1).

    `metrics_port_fallback`: when `cfg.metrics_port` is taken, serve metrics on a free port (printed) instead of
    refusing to start (`Metrics.serve`): a local `handoff run`'s default port."""
    from handoff_spark.decode.registry import registry_columns

    switches.check()  # a switch set to what it does not take: refused now, in one line, not mid-stream
    # The app config as declared (what the operator's query configs are applied to and compared with), and as it runs:
    # a Schema Registry format without declared columns takes the registry's.
    declared = cfg
    cfg = registry_columns(cfg)
    stop_requested = threading.Event()
    markers = marker_dir()
    stop_marker = str(Path(markers) / "stop")

    def on_signal(signum: int, _frame: Any) -> None:
        if stop_requested.is_set():
            echo(f"second {signal.Signals(signum).name}: stopping now")
            raise KeyboardInterrupt
        echo(f"{signal.Signals(signum).name}: finishing the current micro-batch, then stopping")
        stop_requested.set()
        Path(stop_marker).touch()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    metrics = Metrics(cfg.handoff_id)
    if cfg.metrics_port is not None:  # first: a busy port fails in a second
        try:
            port = metrics.serve(cfg.metrics_port, any_if_taken=metrics_port_fallback)
        except HandoffConfigError:
            os.rmdir(markers)  # nothing left behind by a driver that refused to start
            raise
        taken = f" (port {cfg.metrics_port} is taken)" if cfg.metrics_port not in (0, port) else ""
        echo(f"metrics on :{port}/metrics{taken}")
    # In a pod the operator manages: the record also goes to the operator (see progress_publisher).
    publisher = ProgressPublisher.from_env(
        on_error=lambda _exc: metrics.publish_errors.labels(cfg.handoff_id).inc())
    reporter = ProgressReporter(cfg, metrics, echo, publisher)
    min_partitions_file = str(Path(markers) / "min-partitions")
    scaler: ExecutorScaler | None = None
    # A stream the operator manages: a replay holds its query in this driver instead of stopping the pod (driver.hold).
    hold = QueryHold.from_env() if sink_format is None and not available_now else None
    try:
        if hold is not None:
            hold.start()
        start: StartPlan | None = None
        # The JVM launches while this thread prepares the table and reads the ledger (startup.early_session). Its
        # settings depend only on which of transform, dedupe and event time are set, which the pod's own config says.
        pod_cfg = cfg
        session = EarlySession(lambda: build_session(pod_cfg)).start()
        # The operator's query config for this pod (driver.query_config) may be newer than the pod's app.json: it runs,
        # and the start is planned for it (a checkpoint is kept or discarded for the dedupe keys that will run).
        pod_hash = switches.POD_CONFIG_HASH() if hold is not None else None
        running_hash: str | None = None
        refused_hash: str | None = None
        # checked, to run at the batch boundary: the config as declared, as it runs, and its dedupe keys' types
        pending: tuple[query_config.Wanted, AppConfig, AppConfig, dict[str, str] | None] | None = None
        if pod_hash:
            hold.first_answer()  # type: ignore[union-attr]
            wanted = query_config.parse(hold.query_config(), pod_hash)  # type: ignore[union-attr]
            if wanted is not None:
                if not wanted.runs_in(declared):
                    try:
                        declared = query_config.applied(declared, wanted)
                        cfg = registry_columns(declared)
                    except ValueError as exc:
                        session.abandon()
                        line = refusal(exc)
                        echo(line)
                        write_termination_message(line)
                        return TRANSFORM_INVALID_EXIT
                    reporter.cfg = cfg
                    echo(f"running the operator's query config {wanted.config_hash} (newer than the pod's app "
                         f"config)")
                running_hash = wanted.config_hash
        if sink_format is None:
            try:
                # A table or Kafka problem fails in a second or two, with its own message; the table's service not
                # answering is waited for (driver.table_wait), the sink's degraded reason published meanwhile.
                backend = sinks.get(cfg.sink.kind)
                ready, _table = table_wait.when_reachable(
                    lambda: backend.prepare(cfg), backend.is_outage, reason=backend.outage_reason,
                    what=f"table {cfg.sink.table}", wait=stop_requested.wait, say=echo, degraded=reporter.degraded,
                    forget=lambda: backend.forget_clients(cfg), field=backend.outage_field)
                if not ready:  # a stop signal while waiting: nothing was read yet
                    session.abandon()
                    echo("stopped")
                    return 0
                start = prepare_start(cfg, backend, echo)
            except BaseException:
                session.abandon()  # the JVM being launched goes with the refusal, without a word after it
                raise
            reporter.checkpoint_discarded = start.discarded
            log.info("table prepared, start planned")
        spark = session.result()
        log.info("spark session started (%.1f s after the driver's start of it)", session.seconds or 0.0)
        key_types: dict[str, str] | None = None  # the dedupe keys' Spark types in the running query's output
        if frames_query(cfg, sink_format):
            try:
                key_types = transform.check(spark, cfg)
            except transform.TransformInvalid as exc:
                echo(str(exc))
                write_termination_message(str(exc))  # the operator's Degraded/TransformInvalid condition
                return TRANSFORM_INVALID_EXIT
            start = settle_key_types(cfg, start, key_types, echo)
            reporter.checkpoint_discarded = start.discarded
        running_since_ms = int(time.time() * 1000)
        if running_hash is not None:
            reporter.config(running_hash, running_since_ms, changed=False)
        check_again_at = 0.0  # after a check that failed for another reason than the SQL (a catalog hiccup)

        def config_changed() -> str | None:
            """`wait`'s `config_when`: the operator's query config for this pod, when it is new and passes the
            check a start runs (then kept in `pending`); a refused one is said once and the query runs on."""
            nonlocal running_hash, refused_hash, check_again_at, pending
            assert hold is not None
            wanted = query_config.parse(hold.query_config(), pod_hash)
            if wanted is None or wanted.config_hash in (running_hash, refused_hash):
                if wanted is not None and wanted.config_hash == running_hash and refused_hash is not None:
                    refused_hash = None  # back to the config that runs (the operator rolled the refused one back)
                    reporter.config(wanted.config_hash, running_since_ms, changed=False)
                return None
            if wanted.runs_in(declared):  # what runs already (its first read came late): nothing restarts
                running_hash, refused_hash = wanted.config_hash, None
                reporter.config(wanted.config_hash, running_since_ms, changed=False)
                return None
            if time.monotonic() < check_again_at:
                return None
            try:
                candidate_declared = query_config.applied(declared, wanted)
                candidate = registry_columns(candidate_declared)
                candidate_types = transform.check(spark, candidate) if frames_query(candidate, sink_format) else None
                servers_changed = candidate.source.bootstrap_servers != cfg.source.bootstrap_servers
                if servers_changed or candidate.source.topics != cfg.source.topics:
                    problem = source_problem(candidate, backend, servers_changed=servers_changed)
                    if problem:
                        raise SourceInvalid(problem)
            except (transform.TransformInvalid, ValueError) as exc:
                line = refusal(exc)
                refused_hash = wanted.config_hash
                echo(f"the operator's query config {wanted.config_hash} is refused; the query runs on with config "
                     f"{running_hash}: {line}")
                reporter.refused(wanted.config_hash, line)
                return None
            except Exception as exc:  # noqa: BLE001 - not the SQL's fault: the query runs on, checked again later
                log.warning("could not check the operator's query config %s (checked again in %.0f s): %s",
                            wanted.config_hash, LOOKUP_CHECK_SECONDS, str(exc).splitlines()[0][:300])
                check_again_at = time.monotonic() + LOOKUP_CHECK_SECONDS
                return None
            pending = (wanted, candidate_declared, candidate, candidate_types)
            return f"the operator changed the query (config {running_hash} → {wanted.config_hash})"

        config_when = config_changed if pod_hash else None
        if stop_requested.is_set():  # a stop signal during the start: nothing was read yet
            echo("stopped")
            return 0

        def sit_out_hold(line: str) -> tuple[str, StartPlan] | None:
            """Wait while the operator holds the query (driver.hold), saying so; then plan the start again against
            the table the replay left (the ledger is the truth: driver.resume). None: a stop signal came first."""
            assert hold is not None
            request = hold.requested() or "?"
            echo(line.format(request=request))
            reporter.held(request)
            if not hold.wait_released(stop_requested.is_set):
                echo("stopped")
                return None
            return request, prepare_start(cfg, backend, echo, key_types=key_types)

        if hold is not None and hold.first_answer() is not None:
            # Started while a replay holds the stream (the pod restarted mid-replay): no batch until it is lifted.
            resumed = sit_out_hold("the operator holds the query ({request}): waiting before the first batch")
            if resumed is None:
                return 0
            start = resumed[1]
            reporter.checkpoint_discarded = start.discarded
        start_offsets = query_start_offsets(cfg, start, sink_format)
        # The lookups' versions before the query reads them: a change in between restarts it rather than being missed.
        restart_when = lookups_changed(cfg) if frames_query(cfg, sink_format) else None
        if frames_query(cfg, sink_format):
            reporter.seed_line = ckpt.read_seed_line(cfg.checkpoint_location)
        query: Any = None
        # In a pod the operator manages: its desired executor count is applied live (see executor_scaler). Started
        # before the session's warm-up, whose tasks wait for the executors it asks for (minExecutors may be 0).
        scaler = ExecutorScaler.for_session(spark, cfg, min_partitions_file=min_partitions_file,
                                            partitions_per_core=MIN_PARTITIONS_PER_CORE, echo=echo,
                                            idle=lambda: query is None or not query.status.get("isTriggerActive"))
        if scaler is not None:
            scaler.start()
        if sink_format is None and not available_now and session_warmup.enabled():
            # Spark starts its Python daemons one after another on the first batch's path (planner, writer,
            # worker daemon, commit runner); the warm-up query starts them before the stream's query, or beside
            # its first batch (startup.session_warmup, HANDOFF_SESSION_WARMUP_AT).
            def warm_stop() -> str | None:
                return "stop requested" if stop_requested.is_set() else None

            if session_warmup.before_query():
                log.info(session_warmup.run(spark, cfg, warm_stop))
                if stop_requested.is_set():  # a stop signal during the warm-up: nothing was read yet
                    echo("stopped")
                    return 0
            else:
                session_warmup.start_beside(spark, cfg, warm_stop)
        query = start_query(spark, cfg, available_now=available_now, stop_marker=stop_marker,
                            sink_format=sink_format, start_offsets=start_offsets,
                            min_partitions_file=min_partitions_file)
        # Once per driver process: scaling and replays must never restart the query (the e2e tests count this line).
        echo(f"query {query.id} started (run {query.runId})")
        metrics.query_starts.labels(cfg.handoff_id, "start").inc()
        quarantined = 0
        while True:
            try:
                rc = wait(query, stop_requested, echo, reporter, restart_when=restart_when, stop_marker=stop_marker,
                          hold=hold, config_when=config_when)
            except KeyboardInterrupt:
                query.stop()
                return 130
            if rc == HOLD_QUERY and hold is not None and not stop_requested.is_set():
                resumed = sit_out_hold("query held by the operator ({request}): stopped at a batch boundary, this "
                                       "driver waits")
                if resumed is None:
                    return 0
                request, start = resumed
                start_offsets = query_start_offsets(cfg, start, sink_format)
                reporter.new_query(start.discarded, ckpt.read_seed_line(cfg.checkpoint_location)
                                   if frames_query(cfg, sink_format) else {})
                restart_when = lookups_changed(cfg) if frames_query(cfg, sink_format) else None
                query = start_query(spark, cfg, available_now=available_now, stop_marker=stop_marker,
                                    sink_format=sink_format, start_offsets=start_offsets,
                                    min_partitions_file=min_partitions_file)
                echo(f"query {query.id} restarted after the operator lifted its hold {request} (run {query.runId})")
                metrics.query_starts.labels(cfg.handoff_id, "hold").inc()
                continue
            if rc == HOLD_QUERY:
                rc = 0
            if rc == CONFIG_QUERY and not stop_requested.is_set():
                # The operator changed the query: its start planned again as a driver's start plans it (a checkpoint
                # whose dedupe state no longer fits is discarded, the window rebuilt: driver.resume, driver.seed), and
                # a new query in this session.
                assert pending is not None
                (wanted, new_declared, new_cfg, new_types), pending = pending, None
                # Another declared schema: the table reconciled with it now, as at a start, or the config refused
                # (the table cannot take it) or put off (the catalog failed), and the query before started again, its
                # checkpoint as it was.
                schema = reconcile_schema(backend, cfg, new_cfg)
                if schema.taken:
                    declared, cfg, key_types = new_declared, new_cfg, new_types
                    reporter.cfg, running_hash, refused_hash = cfg, wanted.config_hash, None
                    running_since_ms = int(time.time() * 1000)
                elif schema.refused is not None:
                    refused_hash = wanted.config_hash
                    echo(f"the operator's query config {wanted.config_hash} is refused; the query runs on with config "
                         f"{running_hash}: {schema.refused}")
                    reporter.refused(wanted.config_hash, schema.refused)
                else:
                    check_again_at = time.monotonic() + LOOKUP_CHECK_SECONDS
                    echo(f"could not reconcile the table with the operator's query config {wanted.config_hash} (tried "
                         f"again in {LOOKUP_CHECK_SECONDS:.0f} s); the query runs on with config {running_hash}: "
                         f"{schema.retry}")
                start = prepare_start(cfg, backend, echo, key_types=key_types)
                start_offsets = query_start_offsets(cfg, start, sink_format)
                reporter.new_query(start.discarded, ckpt.read_seed_line(cfg.checkpoint_location)
                                   if frames_query(cfg, sink_format) else {})
                restart_when = lookups_changed(cfg)
                query = start_query(spark, cfg, available_now=available_now, stop_marker=stop_marker,
                                    sink_format=sink_format, start_offsets=start_offsets,
                                    min_partitions_file=min_partitions_file)
                if schema.taken:
                    reporter.config(wanted.config_hash, running_since_ms, changed=True)
                    echo(f"query {query.id} restarted with the operator's query config {wanted.config_hash} "
                         f"(run {query.runId})")
                else:
                    echo(f"query {query.id} restarted with config {running_hash}, the one it ran (run {query.runId})")
                metrics.query_starts.labels(cfg.handoff_id, "config").inc()
                continue
            if rc == CONFIG_QUERY:
                rc = 0
            if rc == RESTART_QUERY and not stop_requested.is_set():
                restart_when = lookups_changed(cfg)
                query = start_query(spark, cfg, available_now=available_now, stop_marker=stop_marker,
                                    sink_format=sink_format, min_partitions_file=min_partitions_file)
                echo(f"query {query.id} restarted with the lookups' new content (run {query.runId})")
                metrics.query_starts.labels(cfg.handoff_id, "lookup").inc()
                continue
            if rc == RESTART_QUERY:
                rc = 0
            if rc != 1 or sink_format is not None or not cfg.frame_path or stop_requested.is_set():
                return rc
            # One record must never stop a stream: the records the transform fails on become dead letters and
            # the query starts again in this session (driver.quarantine).
            bad = quarantine.quarantine_failed_batch(spark, cfg)
            quarantined += len(bad)
            if not bad or quarantined > quarantine.MAX_QUARANTINED:
                return rc
            echo(f"the transform failed on {len(bad)} record(s) (first {bad[0]['topic']}[{bad[0]['partition']}]@"
                 f"{bad[0]['offset']}: {bad[0]['reason'][:200]}): dead letters with reason transform-error; "
                 f"restarting the query")
            query = start_query(spark, cfg, available_now=available_now, stop_marker=stop_marker,
                                sink_format=sink_format, min_partitions_file=min_partitions_file)
            echo(f"query {query.id} restarted after a quarantine (run {query.runId})")
            metrics.query_starts.labels(cfg.handoff_id, "quarantine").inc()
    finally:
        if hold is not None:
            hold.close()
        if scaler is not None:
            scaler.close()
        if publisher is not None:
            publisher.close()
        Path(min_partitions_file).unlink(missing_ok=True)
        Path(stop_marker).unlink(missing_ok=True)
        os.rmdir(markers)


@dataclass(frozen=True)
class SchemaReconciled:
    """What `reconcile_schema` made of a query config's schema: taken (neither set), refused in one line (the table
    cannot take it), or not tried now (the catalog failed: the query before runs on and it is tried again later)."""

    refused: str | None = None
    retry: str | None = None

    @property
    def taken(self) -> bool:
        return self.refused is None and self.retry is None


def reconcile_schema(backend: Any, running: AppConfig, new: AppConfig) -> SchemaReconciled:
    """At the batch boundary of a query config with another declared schema: the table reconciled with it as a
    driver's start does (`prepare`: created if missing, columns added or widened under evolution=compatible), or the
    one line refusing it (`SchemaIncompatible: …`) when the table cannot take it. The same schema: nothing to do.
    Any other failure (the catalog or BigQuery did not answer) is not the spec's: the config is tried again later
    rather than refused, and rather than failing the driver mid-stream."""
    if new.schema_ == running.schema_:
        return SchemaReconciled()
    try:
        backend.prepare(new)
    except SchemaIncompatibleError as exc:
        return SchemaReconciled(refused=f"{contract.SCHEMA_INCOMPATIBLE}: spec.schema: "
                                        f"{' '.join(str(exc).split())[:400]}")
    except Exception as exc:  # noqa: BLE001 - the table's service failed, not the spec: tried again later
        return SchemaReconciled(retry=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    return SchemaReconciled()


def query_start_offsets(cfg: AppConfig, start: StartPlan | None,
                        sink_format: str | None) -> dict[str, dict[int, int]] | None:
    """The source's start offsets for a query on a fresh checkpoint: the ledger's ends, earlier for a dedupe whose
    window must be rebuilt (driver.seed)."""
    if start is None:
        return None
    offsets = start.start_offsets()
    if frames_query(cfg, sink_format):
        for (topic, partition), offset in seed.plan(cfg, start.ledger).items():
            offsets.setdefault(topic, {})[partition] = offset
    return offsets


def frames_query(cfg: AppConfig, sink_format: str | None) -> bool:
    """This driver's query runs the DataFrame path (a transform, dedupe or event time, and the configured sink)."""
    return cfg.frame_path and sink_format is None


def lookups_changed(cfg: AppConfig) -> Callable[[], str | None] | None:
    """`wait`'s `restart_when` for a transform with lookups: the names of the lookups whose table changed since
    now (None without lookups)."""
    if cfg.transform is None or not cfg.transform.lookups:
        return None
    seen = transform.lookup_versions(cfg)

    def changed() -> str | None:
        try:
            now = transform.lookup_versions(cfg)
        except Exception as exc:  # noqa: BLE001 - a catalog hiccup: ask again at the next check
            log.warning("lookup versions unavailable: %s", exc)
            return None
        names = sorted(name for name, version in now.items() if version != seen.get(name))
        return f"lookup {', '.join(names)} changed" if names else None
    return changed


def refusal(exc: Exception) -> str:
    """The one line of a query config that cannot run: the check's own, or the app config's rule it breaks."""
    if isinstance(exc, (transform.TransformInvalid, SourceInvalid)):
        return str(exc)
    first = str(exc).strip().splitlines()
    return f"{contract.TRANSFORM_INVALID}: spec: {' '.join(first[:3])[:400]}"


#: Where Kubernetes reads a container's termination message (the pod spec's default `terminationMessagePath`).
TERMINATION_LOG = "/dev/termination-log"


def write_termination_message(message: str, path: str = TERMINATION_LOG) -> None:
    """`message` as the container's termination message, when there is one to write (in a pod; elsewhere the
    path is missing or not writable and the console line is all there is)."""
    try:
        if os.path.exists(path):
            with open(path, "w") as fh:
                fh.write(message[:4000])
    except OSError:
        pass


#: `wait`'s answer when `restart_when` asked for the query to start again (a lookup table changed).
RESTART_QUERY = -1
#: `wait`'s answer when the operator holds the query (driver.hold): stopped at a batch boundary.
HOLD_QUERY = -2
#: The progress record's keys about a hold (driver.hold): stopping for one, stopped under one.
HOLD_KEYS = frozenset({QUERY_HELD_KEY, QUERY_HOLDING_KEY})
#: The progress record's keys about the config this driver runs (driver.query_config).
CONFIG_KEYS = frozenset({CONFIG_HASH_KEY, CONFIG_SINCE_KEY, CONFIG_COMMITTED_KEY, CONFIG_REFUSED_HASH_KEY,
                         CONFIG_REFUSED_KEY})
#: `wait`'s answer when `config_when` asked for the query to start again with the operator's new query config.
CONFIG_QUERY = -3
#: How often `restart_when` is asked.
LOOKUP_CHECK_SECONDS = 10.0


def wait(query: Any, stop_requested: threading.Event, echo: Callable[[str], None],
         reporter: ProgressReporter | None = None, restart_when: Callable[[], str | None] | None = None,
         stop_marker: str | None = None, hold: QueryHold | None = None,
         config_when: Callable[[], str | None] | None = None) -> int:
    """Follow the query until it ends (0 done or stopped, 1 failed). `restart_when`: asked every
    `LOOKUP_CHECK_SECONDS`; a reason stops the query at a batch boundary (through the stop marker) and returns
    `RESTART_QUERY`. `hold`: the operator's hold appearing does the same and returns `HOLD_QUERY`. `config_when`:
    asked at every turn (it reads what the hold's poll read); a reason does the same and returns `CONFIG_QUERY`."""
    from pyspark.errors import StreamingQueryException

    def stop_between_batches(answer: int) -> int:
        Path(stop_marker).touch()  # type: ignore[arg-type]
        try:
            stop_at_batch_boundary(query, echo, switches.STOP_GRACE_SECONDS())
        finally:
            Path(stop_marker).unlink(missing_ok=True)  # type: ignore[arg-type]
        if reporter is not None:
            reporter.poll(query)
        return answer

    next_check = time.monotonic() + LOOKUP_CHECK_SECONDS
    try:
        while query.isActive:
            if reporter is not None:
                reporter.poll(query)
            if stop_requested.is_set():
                stop_at_batch_boundary(query, echo, switches.STOP_GRACE_SECONDS())
                break
            request = hold.requested() if hold is not None else None
            if request is not None and stop_marker:
                echo(f"the operator holds the query ({request}): stopping it at the batch boundary")
                if reporter is not None:
                    reporter.holding(request)
                return stop_between_batches(HOLD_QUERY)
            reason = config_when() if config_when is not None and stop_marker else None
            if reason:
                echo(f"{reason}: restarting the query at the batch boundary")
                return stop_between_batches(CONFIG_QUERY)
            if restart_when is not None and time.monotonic() >= next_check:
                next_check = time.monotonic() + LOOKUP_CHECK_SECONDS
                reason = restart_when()
                if reason and stop_marker:
                    echo(f"{reason}: restarting the query at the batch boundary")
                    return stop_between_batches(RESTART_QUERY)
            query.awaitTermination(0.5)
        if reporter is not None:
            reporter.poll(query)
        exc = query.exception()
        if exc is not None:
            raise exc
    except StreamingQueryException as exc:
        echo(f"query failed: {exc}")
        return 1
    echo("stopped" if stop_requested.is_set() else "done")
    return 0


def stop_at_batch_boundary(query: Any, echo: Callable[[str], None], grace_seconds: float) -> None:
    """The source admits nothing new once the stop marker exists; wait until no trigger is running
    (seen twice, so a trigger that merely polls for data is not mistaken for a batch) or `grace_seconds`
    (`HANDOFF_STOP_GRACE_SECONDS`) have passed, then stop."""
    deadline = time.monotonic() + grace_seconds
    idle_seen = 0
    while query.isActive and time.monotonic() < deadline:
        status = query.status
        idle_seen = idle_seen + 1 if not status.get("isTriggerActive") else 0
        if idle_seen >= 2:
            break
        time.sleep(0.2)
    else:
        if query.isActive:
            echo(f"no batch boundary within {grace_seconds:.0f}s: stopping mid-batch (the batch will replay)")
    if query.isActive:
        query.stop()
