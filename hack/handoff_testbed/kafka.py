"""Apache Kafka, single-node KRaft (broker + controller in one JVM), from the official Maven Central jars.

Why jars and not a Kafka look-alike: the exactly-once contract leans on broker behaviour the
look-alikes get wrong (ListOffsets high watermark, read_committed hiding aborted records, timestamp
lookups, retention actually deleting segments). `mvn dependency:copy-dependencies` over
`hack/kafka/pom.xml` gives the same jars as the release tarball; Java 17 runs them.
"""
from __future__ import annotations

import base64
import hashlib
import logging
import os
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import Mapping

from .base import ServiceComponent
from .paths import HACK_DIR, cache_dir
from .proc import Service, free_port, port_open, run, wait_until

KAFKA_VERSION = os.environ.get("HANDOFF_KAFKA_VERSION", "4.4.0")
POM = HACK_DIR / "kafka" / "pom.xml"
READY_TIMEOUT_S = 90.0

# Small broker for tests: one replica everywhere, few internal partitions (the 50 default
# __consumer_offsets partitions cost seconds on first group use), retention checked every 5 s (after
# a 1 s initial delay instead of 30 s) so retention drills finish in seconds, no topic
# auto-creation so a typo fails loudly.
_BASE_PROPERTIES: dict[str, str] = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "5",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "5",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "min.insync.replicas": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    "log.retention.check.interval.ms": "5000",
    "log.initial.task.delay.ms": "1000",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "10000",
    # After kill -9 the restarted broker cannot register until its old incarnation's session expires
    # (default 9 s); 6 s keeps crash drills shorter while a GC pause on a busy 2-core box still
    # cannot fence the only broker.
    "broker.session.timeout.ms": "6000",
    "broker.heartbeat.interval.ms": "1000",
}

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


def _cluster_id() -> str:
    """Kafka's cluster-id format (base64url of a UUID, no padding); never starting with '-' so the
    storage tool does not read it as an option (Kafka's own Uuid.randomUuid avoids that too)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


class Kafka(ServiceComponent):
    """One KRaft node on two free loopback ports; `restart()`/`kill()` keep ports and data for drills.

    `restart()` is a graceful stop (controlled shutdown); `kill()` is kill -9, as a crashed broker:
    unflushed page cache survives, in-flight requests do not."""

    stop_timeout = 30.0

    name = "kafka"

    def __init__(self, version: str = KAFKA_VERSION) -> None:
        super().__init__()
        self.version = version
        self.home = cache_dir() / f"kafka-{version}"
        self.port = 0
        self.controller_port = 0
        self.env: dict[str, str] = {}
        self.startup_seconds: float | None = None
        # An address pods reach the host at (the test-bed node's bridge gateway): when set, the broker
        # also listens and advertises there, so clients in pods follow metadata to an address they reach.
        self.pod_host: str | None = None
        self.pod_port = 0

    # ---- build -------------------------------------------------------------------------------
    @property
    def libs(self) -> Path:
        return self.home / "libs"

    def _stamp_value(self) -> str:
        return f"{self.version} {hashlib.sha256(POM.read_bytes()).hexdigest()}"

    def build(self) -> None:
        """Copy the broker's runtime jars into the cache once (stamp = version + pom hash)."""
        stamp = self.home / ".built"
        if stamp.exists() and stamp.read_text() == self._stamp_value():
            return
        if shutil.which("java") is None or shutil.which("mvn") is None:
            raise RuntimeError("kafka needs java (17) and mvn on PATH: run hack/install-system-deps.sh")
        tmp = self.home / "libs.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        self.home.mkdir(parents=True, exist_ok=True)
        run(["mvn", "-q", "-B", "-f", str(POM), f"-Dkafka.version={self.version}",
             "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={tmp}"],
            log=self.home / "build.log")
        shutil.rmtree(self.libs, ignore_errors=True)
        tmp.rename(self.libs)
        stamp.write_text(self._stamp_value())

    # ---- run ---------------------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _java(self, main: str, *args: str, heap: str, extra: tuple[str, ...] = ()) -> list[str]:
        assert self.workdir is not None
        # Its own temporary directory, removed with the workdir: lz4-java unpacks its native library into
        # java.io.tmpdir at every start, and a broker killed with -9 (the drills) leaves it there otherwise.
        (self.workdir / "tmp").mkdir(exist_ok=True)
        return ["java", heap, "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true", *extra,
                f"-Djava.io.tmpdir={self.workdir / 'tmp'}",
                f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={self.workdir}",
                "-cp", f"{self.libs}/*", main, *args]

    @property
    def pod_bootstrap(self) -> str:
        return f"{self.pod_host}:{self.pod_port}"

    def _write_config(self) -> Path:
        assert self.workdir is not None
        props = dict(_BASE_PROPERTIES)
        listeners = f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
        advertised = f"PLAINTEXT://127.0.0.1:{self.port}"
        if self.pod_host:
            listeners += f",PODS://{self.pod_bootstrap}"
            advertised += f",PODS://{self.pod_bootstrap}"
            props["listener.security.protocol.map"] += ",PODS:PLAINTEXT"
        props.update({
            "listeners": listeners,
            "advertised.listeners": advertised,
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "log.dirs": str(self.workdir / "data"),
        })
        path = self.workdir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.workdir / "log4j2.properties").write_text(_LOG4J2)
        return path

    def _start(self, workdir: Path) -> dict[str, str]:
        """Fresh data dir: write config, format storage with a new cluster id, start, wait for a broker."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port, self.controller_port = free_port(), free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        if self.pod_host:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((self.pod_host, 0))
                self.pod_port = int(sock.getsockname()[1])
        t0 = time.monotonic()
        config = self._write_config()
        # C1 JIT only: the formatter is a 1 s job where C2 compilation is pure overhead.
        run(self._java("kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(config),
                       heap="-Xmx256m", extra=("-XX:TieredStopAtLevel=1",)),
            log=self.workdir / "format.log")
        self._launch()
        self.startup_seconds = time.monotonic() - t0
        self.env = {"KAFKA_BOOTSTRAP": self.bootstrap}
        if self.pod_host:
            self.env["KAFKA_POD_BOOTSTRAP"] = self.pod_bootstrap
        return dict(self.env)

    def _launch(self) -> None:
        assert self.workdir is not None
        self.service = Service(
            "kafka", self._java("kafka.Kafka", str(self.workdir / "server.properties"),
                                heap="-Xmx512m", extra=("-Xms128m",)),
            self.workdir / "kafka.log", cwd=self.workdir).start()
        wait_until(self._broker_ready, READY_TIMEOUT_S, "kafka", self.service, interval=0.2)

    def _broker_ready(self) -> bool:
        """Ready = the metadata response lists our broker (it does so only once the broker is unfenced,
        i.e. topics can be created). The port check first keeps librdkafka from logging every refusal."""
        if not port_open(self.port):
            return False
        from confluent_kafka.admin import AdminClient

        quiet = logging.getLogger("handoff_testbed.kafka.probe")
        quiet.propagate = False
        quiet.addHandler(logging.NullHandler())
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": quiet})
        metadata = admin.list_topics(timeout=2)
        return bool(metadata.brokers)

    # ---- conveniences for tests ----------------------------------------------------------------
    def admin(self):
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def recreate_topic(self, name: str, partitions: int = 3) -> None:
        """Delete the topic and create it again under the same name (a new topic id, offsets from 0 again), once the
        broker has finished deleting it (deletion is asynchronous)."""
        from confluent_kafka.admin import NewTopic

        admin = self.admin()  # held: a client dropped while its futures wait destroys them
        admin.delete_topics([name], operation_timeout=30)[name].result(timeout=30)

        def created() -> bool:
            futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)],
                                                 operation_timeout=30)
            try:
                futures[name].result(timeout=30)
            except Exception:  # noqa: BLE001 - TOPIC_ALREADY_EXISTS while the old one is being deleted
                return False
            return True

        wait_until(created, 30, f"topic {name} created again", self.service)
        self.wait_for_leaders(name, partitions)

    def create_topic(self, name: str, partitions: int = 3, config: Mapping[str, str] | None = None) -> None:
        """Create a topic and wait until every partition has a leader (so producing right away works)."""
        from confluent_kafka.admin import NewTopic

        admin = self.admin()
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                                config=dict(config or {}))], operation_timeout=30)
        futures[name].result(timeout=30)
        self.wait_for_leaders(name, partitions)

    def wait_for_leaders(self, name: str, partitions: int) -> None:
        """Wait until every partition of a created topic has a leader (so producing right away works)."""
        admin = self.admin()

        def leaders_known() -> bool:
            topic = admin.list_topics(topic=name, timeout=5).topics.get(name)
            return (topic is not None and topic.error is None and len(topic.partitions) == partitions
                    and all(p.leader >= 0 for p in topic.partitions.values()))

        wait_until(leaders_known, 30, f"topic {name} leaders", self.service)
