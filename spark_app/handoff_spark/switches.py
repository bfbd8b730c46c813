"""Every `HANDOFF_*` environment switch of the data plane (driver, executors, Python workers), read one way.

Each switch is declared once here, with what it does, and is its own typed accessor: `FUSED_READ()` is a bool,
`STOP_GRACE_SECONDS()` a float, `SPARK_MASTER()` a str or None (each takes an optional environment mapping, for
tests; `.name` is the variable). Every module of `handoff_spark` reads its switches through them, never
`os.environ` (`tests/unit/spark/test_switches.py` checks both, and that docs/switches.md, the one
table of them, agrees with `SWITCHES`). Why one place: the switches grew one by one, each read where it was
needed and parsed its own way (some took `off`, some only `0`, a bad number failed with a traceback).

One rule per kind of value (case and surrounding blanks do not matter):
- on/off: `1`, `true`, `yes`, `on` turn it on; `0`, `false`, `no`, `off` turn it off. Unset *or empty* means
  the switch's default: every on/off switch defaults to on, and an empty value always meant on, so it still
  does;
- seconds: a decimal number ≥ 0; unset or empty: the default;
- a choice or a path: as documented per switch; text: as set, unset or empty meaning none.
A value outside its rule raises `SwitchError`: one line naming the variable, what it was and what it takes.
It is a `HandoffConfigError`, so a driver that meets it at start refuses with that line (exit 2).
Every value that meant something before still means it (`0` off and `1` on everywhere, `off`/`false`/`no` where
they turned a switch off, an empty value the default); what no switch documented (`HANDOFF_FUSED_READ=banana`
used to mean on) is refused now.

Five switches are set by the operator in every driver pod, four more for a checkpoint on S3 (`contract.ENV_*`,
whose names live in the contract: the operator writes them, the driver reads them here). The operator's own settings (`HANDOFF_NAMESPACES`,
`HANDOFF_STATUS_INTERVAL`, …) are not switches of the data plane: pydantic-settings reads them into
`handoff_operator.runtime.settings.OperatorSettings` in the operator's process, which never reads the
switches here; docs/switches.md lists both, and no name is in both.

Standard library only (the worker daemon imports this before pyarrow, the operator's tests without pyspark).
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

from handoff_spark import contract
from handoff_spark.errors import HandoffConfigError

ON = frozenset({"1", "true", "yes", "on"})
OFF = frozenset({"0", "false", "no", "off"})

Env = Mapping[str, str] | None


class SwitchError(HandoffConfigError, ValueError):
    """A switch set to a value its rule does not take (the message names the variable and what it takes)."""


@dataclass(frozen=True)
class Switch:
    """One environment switch: its variable, where it takes effect and what it does (docs/switches.md's row).
    Subclasses are the kinds of value, each with its rule; calling a switch reads it."""

    name: str
    read_by: str
    doc: str

    takes: ClassVar[str] = ""

    def raw(self, env: Env = None) -> str | None:
        """The value as set, blanks stripped; None when unset or empty."""
        value = (os.environ if env is None else env).get(self.name)
        return value.strip() if value is not None and value.strip() else None

    def as_set(self, env: Env = None) -> str:
        """`NAME=value` as the environment has it, for a log line or a reason that names the switch."""
        return f"{self.name}={(os.environ if env is None else env).get(self.name, '')}"

    def refuse(self, value: str, takes: str) -> SwitchError:
        return SwitchError(f"{self.name}={value!r}: use {takes}")

    @property
    def shown_default(self) -> str:
        return "unset"

    @property
    def shown_takes(self) -> str:
        return self.takes

    @property
    def shown_read_by(self) -> str:
        return f"{self.read_by}; set by the operator" if self.name in contract.RENDERED_ENV else self.read_by


@dataclass(frozen=True)
class OnOff(Switch):
    """On unless turned off: `1/true/yes/on` on, `0/false/no/off` off; unset or empty: on."""

    takes: ClassVar[str] = "on/off"

    def __call__(self, env: Env = None) -> bool:
        value = self.raw(env)
        if value is None or value.lower() in ON:
            return True
        if value.lower() in OFF:
            return False
        raise self.refuse(value, "1/true/yes/on or 0/false/no/off")

    @property
    def shown_default(self) -> str:
        return "on"


@dataclass(frozen=True)
class Seconds(Switch):
    """A number of seconds ≥ 0; unset or empty: `default`."""

    default: float = 0.0
    takes: ClassVar[str] = "seconds"

    def __call__(self, env: Env = None) -> float:
        value = self.raw(env)
        if value is None:
            return self.default
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not math.isfinite(seconds) or seconds < 0:
            raise self.refuse(value, "a number of seconds ≥ 0")
        return seconds

    @property
    def shown_default(self) -> str:
        return f"{self.default:g}"


@dataclass(frozen=True)
class Text(Switch):
    """Text as set (`what` says what it is); unset or empty: `default` (None unless given)."""

    what: str = "text"
    default: str | None = None

    def __call__(self, env: Env = None) -> str | None:
        return self.raw(env) or self.default

    @property
    def shown_default(self) -> str:
        return self.default or "unset"

    @property
    def shown_takes(self) -> str:
        return self.what


@dataclass(frozen=True)
class Choice(Switch):
    """One of `choices` (case does not matter); unset or empty: the first."""

    choices: tuple[str, ...] = ()

    def __call__(self, env: Env = None) -> str:
        value = self.raw(env)
        if value is None:
            return self.choices[0]
        if value.lower() not in self.choices:
            raise self.refuse(value.lower(), " or ".join(self.choices))
        return value.lower()

    @property
    def shown_default(self) -> str:
        return self.choices[0]

    @property
    def shown_takes(self) -> str:
        return ", ".join(self.choices)


@dataclass(frozen=True)
class PathOrOff(Switch):
    """A path; empty, an off word or `none`: off (False); unset: None (the reader's own default, `unset_means`)."""

    unset_means: str = "unset"
    takes: ClassVar[str] = "a path, or 0/false/no/off/none"

    def __call__(self, env: Env = None) -> str | Literal[False] | None:
        value = (os.environ if env is None else env).get(self.name)
        if value is None:
            return None
        return False if not value.strip() or value.strip().lower() in OFF | {"none"} else value

    @property
    def shown_default(self) -> str:
        return self.unset_means


# ------------------------------------------------------------------------ start-up speed (one per piece)

SESSION_WARMUP = OnOff(
    "HANDOFF_SESSION_WARMUP", "driver (`startup.session_warmup`)",
    "The session's warm-up query (Spark's Python daemons and workers started ahead of the stream's first batch "
    "instead of one after another on its path; `HANDOFF_SESSION_WARMUP_AT` says when).")
SESSION_WARMUP_AT = Choice(
    "HANDOFF_SESSION_WARMUP_AT", "driver (`startup.session_warmup`)",
    "When the session's warm-up query runs: `beside` the stream's first batch (the two overlap), or to its end "
    "`before` the stream's query starts (its first batch then finds the daemons started, but the first commit "
    "comes ~0.7 s later on 2 cores: docs/benchmarks.md, \"Cold start\").",
    choices=("beside", "before"))
SPARK_CDS_ARCHIVE = PathOrOff(
    "HANDOFF_SPARK_CDS_ARCHIVE", "driver (`startup.jvm_cds`)",
    "The JVMs' class-data-sharing archive: this file (when it exists), none when off, else the machine's "
    "cache's (`~/.cache/handoff/spark-cds/`) when built. The project's image sets `/opt/handoff/spark-cds.jsa`, "
    "made at its build.", unset_means="the machine's cache")
FORK_SERVER = OnOff(
    "HANDOFF_FORK_SERVER", "driver (`startup.fork_server`)",
    "Spark's Python processes (the planners, the source and commit runners, and with a local master the worker "
    "daemon) forked from a server that imported pyspark and the sink's write path while the JVM launched, instead "
    "of each a fresh interpreter started one after another. In a driver pod only with `HANDOFF_FORK_LAUNCHER` "
    "(the image's) and executors of the same image.")
FORK_LAUNCHER = PathOrOff(
    "HANDOFF_FORK_LAUNCHER", "driver (`startup.fork_server`); set by the image",
    "The image's fork-server launcher (`python -m handoff_spark.startup.fork_server --install-launcher PATH` at "
    "its build): with a `k8s://` master the driver makes it Spark's Python, for its own JVM and for the executor "
    "pods, where it runs the real interpreter. Unset or off: no fork server in a driver pod.",
    unset_means="none (a local master writes its own)")
FORK_SOCKET = Text(
    "HANDOFF_FORK_SOCKET", "the image's launcher (`startup.fork_client`); set by the driver",
    "The fork server's socket, which the driver names for its own JVM's Python processes; unset (an executor "
    "pod): the launcher runs the real interpreter.", what="a socket path")
WORKER_PRELOAD = OnOff(
    "HANDOFF_WORKER_PRELOAD", "Python worker daemon (`startup.worker_daemon`)",
    "The worker daemon imports pyarrow, confluent-kafka and the write path of the handoff's sink (PyIceberg for "
    "Iceberg) before it forks workers.")
WORKER_SINK = Text(
    "HANDOFF_WORKER_SINK", "Python worker daemon (`startup.worker_daemon`); set by the driver",
    "The handoff's sink, whose write path the worker daemon preloads (the driver passes it through "
    "`spark.executorEnv.*`); unset or another value: every sink's.", what="iceberg or bigquery")
JVM_C1_ONLY = OnOff(
    "HANDOFF_JVM_C1_ONLY", "driver (`driver.app`, JVM options)",
    "The driver's and executors' JVMs compile with C1 only (`-XX:TieredStopAtLevel=1`) unless sparkConf "
    "chooses a compilation mode, or the handoff runs the DataFrame path (a transform, dedupe or event time: its "
    "JVMs move records and C2 pays, docs/design/spark-data-path.md); off: the JVM's default.")

# ------------------------------------------------------------------------------------- the data path

FUSED_READ = OnOff(
    "HANDOFF_FUSED_READ", "driver (`driver.app`)",
    "Write tasks of both table sinks read their Kafka ranges themselves (`handoff-kafka-ranges`); off: the "
    "record source (records cross Python → JVM → Python), for comparison.")
KAFKA_READER = Choice(
    "HANDOFF_KAFKA_READER", "every process reading Kafka (`kafka.native`)",
    "How ranges are read: `native` (librdkafka into Arrow buffers, C) or `python` (confluent-kafka's "
    "Consumer).", choices=("native", "python"))

# ----------------------------------------------------------------------- the driver and its operator

SPARK_MASTER = Text(
    contract.ENV_SPARK_MASTER, "driver (`driver.app`)",
    "The Spark master when the app config's sparkConf names none (`k8s://…` in the driver pod, `local[*]` "
    "in a Backfill Job).", what="a Spark master URL")
STOP_GRACE_SECONDS = Seconds(
    contract.ENV_STOP_GRACE_SECONDS, "driver (`driver.app`)",
    "How long a stopping driver waits for a batch boundary before it stops mid-batch (the batch replays).",
    default=300.0)
SPARK_LOG_LEVEL = Text(
    "HANDOFF_SPARK_LOG_LEVEL", "driver (`driver.app`)", "The log level of the driver's Spark context.",
    what="a Spark log level", default="WARN")
PROGRESS_CONFIGMAP = Text(
    contract.ENV_PROGRESS_CONFIGMAP, "driver (`driver.publisher`, `driver.executor_scaler`, `driver.hold`)",
    "Where the driver publishes its progress record and reads the desired executor count and a replay's hold on "
    "its query; unset (a local run): none of them.", what="a ConfigMap name")
PROGRESS_NAMESPACE = Text(contract.ENV_PROGRESS_NAMESPACE,
                          "driver (`driver.publisher`, `driver.executor_scaler`, `driver.hold`)",
                          "The progress ConfigMap's namespace.", what="a namespace")
DRIVER_POD_NAME = Text(
    contract.ENV_DRIVER_POD_NAME, "driver (`driver.publisher`)", "The driver pod's name, published with each "
    "record so the operator tells the running driver's report from an old one.", what="a pod name")
POD_CONFIG_HASH = Text(
    contract.ENV_POD_CONFIG_HASH, "driver (`driver.query_config`)",
    "The driver pod's config hash (its `handoff.io/config-hash`): the driver applies the operator's query config (a "
    "changed transform, dedupe, event time, schema, dead-letter topic, replay window, source servers, topics or other source query settings, or pace) in place "
    "only when it was made for this pod's template.",
    what="a config hash")
PROGRESS_PUBLISH_SECONDS = Seconds(
    "HANDOFF_PROGRESS_PUBLISH_SECONDS", "driver (`driver.publisher`)",
    "How often the driver republishes its progress record as a heartbeat (a changed `degradedReason` or held "
    "query goes out at once).", default=15.0)
SCALE_POLL_SECONDS = Seconds(
    "HANDOFF_SCALE_POLL_SECONDS", "driver (`driver.executor_scaler`)",
    "How often the driver reads the operator's desired executor count.", default=5.0)
HOLD_POLL_SECONDS = Seconds(
    "HANDOFF_HOLD_POLL_SECONDS", "driver (`driver.hold`)",
    "How often the driver reads whether the operator holds its query (a replay rolls the table back meanwhile).",
    default=1.0)

# ------------------------------------------------------------------------------ a checkpoint on S3

CHECKPOINT_S3_ENDPOINT = Text(
    contract.ENV_CHECKPOINT_S3_ENDPOINT, "driver and Python workers (`checkpoint`, `driver.app`)",
    "The S3 endpoint of an `s3a://` checkpoint (spec.checkpoint.endpoint): Spark's `fs.s3a.endpoint` and "
    "pyarrow's for Handoff's own checkpoint files; unset: AWS S3.", what="a URL")
CHECKPOINT_S3_PATH_STYLE = Text(
    contract.ENV_CHECKPOINT_S3_PATH_STYLE, "driver and Python workers (`checkpoint`, `driver.app`)",
    "Path-style requests to the checkpoint's S3 store (spec.checkpoint.pathStyleAccess): Spark's "
    "`fs.s3a.path.style.access`; unset: S3A's default.", what="true or false")
CHECKPOINT_S3_REGION = Text(
    contract.ENV_CHECKPOINT_S3_REGION, "driver and Python workers (`checkpoint`, `driver.app`)",
    "The region of the checkpoint's bucket (spec.checkpoint.region): Spark's `fs.s3a.endpoint.region`; unset: "
    "AWS_REGION, else us-east-1.", what="an AWS region")
CHECKPOINT_CREDENTIALS_SECRET = Text(
    contract.ENV_CHECKPOINT_CREDENTIALS_SECRET, "driver (`driver.app`)",
    "The Secret with the checkpoint store's AWS keys (spec.checkpoint.credentialsSecret): the driver asks Spark "
    "to set them in its executor pods from it (`spark.kubernetes.executor.secretKeyRef.*`).", what="a Secret name")
HADOOP_AWS_JARS = Text(
    "HANDOFF_HADOOP_AWS_JARS", "driver (`driver.app`)",
    "A directory of hadoop-aws and AWS SDK jars added to `spark.jars` for an `s3a://` checkpoint, where "
    "pyspark's own jars lack them (a local run; the image has them): `python -m handoff_testbed.jars` prints "
    "the test bed's.", what="a directory")

# ----------------------------------------------------------------------------- a checkpoint on GCS

CHECKPOINT_GCS_ENDPOINT = Text(
    contract.ENV_CHECKPOINT_GCS_ENDPOINT, "driver and Python workers (`checkpoint`, `driver.app`)",
    "The JSON API root URL of a `gs://` checkpoint's store when it is not Google's (spec.checkpoint.endpoint: an "
    "emulator, a private endpoint): Spark's `fs.gs.storage.root.url` and pyarrow's endpoint; unset: Google Cloud "
    "Storage.", what="a URL")
CHECKPOINT_GCS_ANONYMOUS = Text(
    contract.ENV_CHECKPOINT_GCS_ANONYMOUS, "driver and Python workers (`checkpoint`, `driver.app`)",
    "`true`: requests to a `gs://` checkpoint's store carry no credentials (spec.checkpoint.anonymous: an emulator); "
    "unset: a key file from GOOGLE_APPLICATION_CREDENTIALS, else the pod's own Google identity.", what="true or false")
GOOGLE_APPLICATION_CREDENTIALS = Text(
    contract.ENV_GOOGLE_APPLICATION_CREDENTIALS, "driver and Python workers (`driver.app`; pyarrow and the GCS "
    "connector)", "Google's own variable: the service account key file of a `gs://` checkpoint (the operator mounts "
    "spec.checkpoint.credentialsSecret's key.json and points this at it); the driver hands the path to the GCS "
    "connector and to its executors; unset: the pod's own Google identity.", what="a path")
HADOOP_GCS_JARS = Text(
    "HANDOFF_HADOOP_GCS_JARS", "driver (`driver.app`)",
    "A directory holding Google's GCS connector jar, added to `spark.jars` for a `gs://` checkpoint where pyspark's "
    "own jars lack it (a local run; the image has it): `python -m handoff_testbed.jars` prints the test bed's.",
    what="a directory")

# ----------------------------------------------------------------------------------------- tests only

FAULT = Text(
    "HANDOFF_FAULT", "driver and executors (`faults`)",
    "Test hook: kill, fail, stall or pause the app at a named point of a batch (the exactly-once drills); "
    "inert unless set.", what="`<point>:batch=<N>[,once=<file>]`, `;`-separated")
FAULT_LOG = Text(
    "HANDOFF_FAULT_LOG", "driver and executors (`faults`)",
    "Test hook: a file each fired crash appends `<point> batch=<N>` to.", what="a file path")

#: Every switch, by variable, in the table's order.
SWITCHES: dict[str, Switch] = {s.name: s for s in globals().copy().values() if isinstance(s, Switch)}


def check(env: Env = None) -> None:
    """Read every switch once: a value outside its rule raises `SwitchError` now (the driver calls this first)."""
    for switch in SWITCHES.values():
        switch(env)  # type: ignore[operator]


def table() -> str:
    """docs/switches.md's table of the data plane's switches (`python -m handoff_spark.switches`)."""
    rows = ["| variable | default | takes | read by | what it does |", "|---|---|---|---|---|"]
    rows += [f"| `{s.name}` | {s.shown_default} | {s.shown_takes} | {s.shown_read_by} | {s.doc} |"
             for s in SWITCHES.values()]
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
