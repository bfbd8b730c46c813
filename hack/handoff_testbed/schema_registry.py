"""A Schema Registry with the Confluent REST API: Apicurio Registry 2.6 (in-memory), from Maven Central.

Why Apicurio: Confluent's own registry is not on any registry this project may use, Karapace is not on
PyPI; Apicurio's release assembly (`io.apicurio:apicurio-registry-app:<v>:tar.gz:all`) is on Maven Central and
runs on Java 17. Its `ccompat` API (`/apis/ccompat/v7`) is the Confluent Schema Registry API, so
confluent-kafka's `SchemaRegistryClient` and serializers talk to it unchanged (probed: register, get by id,
versions, Avro/Protobuf/JSON Schema serializers).

Start-up is slow (Quarkus + H2: 60-90 s measured on a 2-core box at load 20-30; idle not measured), so tests
share one per session.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
import urllib.request
from pathlib import Path

from .base import ServiceComponent
from .paths import HACK_DIR, cache_dir
from .proc import Service, free_port, run, wait_until

VERSION = os.environ.get("HANDOFF_APICURIO_VERSION", "2.6.13.Final")
POM = HACK_DIR / "schema-registry" / "pom.xml"
READY_TIMEOUT_S = 240.0
CCOMPAT_PATH = "/apis/ccompat/v7"


class SchemaRegistry(ServiceComponent):
    """One Apicurio Registry on a free loopback port; `url` is the Confluent-compatible base URL."""

    name = "schema-registry"
    stop_timeout = 20.0

    def __init__(self, version: str = VERSION) -> None:
        super().__init__()
        self.version = version
        self.home = cache_dir() / f"apicurio-registry-{version}"
        self.port = 0
        self.env: dict[str, str] = {}
        self.startup_seconds: float | None = None

    # ---- build -------------------------------------------------------------------------------
    @property
    def app(self) -> Path:
        return self.home / "app"

    @property
    def runner(self) -> Path:
        return self.app / f"apicurio-registry-app-{self.version}-runner.jar"

    def _stamp_value(self) -> str:
        return f"{self.version} {hashlib.sha256(POM.read_bytes()).hexdigest()}"

    def _built(self) -> bool:
        stamp = self.home / ".built"
        return stamp.exists() and stamp.read_text() == self._stamp_value() and self.runner.exists()

    def build(self) -> None:
        """Unpack Apicurio's release assembly into the cache once (stamp = version + pom hash), under a file
        lock so parallel sessions do not unpack into each other."""
        if self._built():
            return
        if shutil.which("java") is None or shutil.which("mvn") is None:
            raise RuntimeError("schema-registry needs java (17) and mvn on PATH: run hack/install-system-deps.sh")
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._built():
                return
            tmp = self.home / "app.tmp"
            build_dir = self.home / "maven-build"  # the plugin's "already unpacked" markers: fresh with the unpack
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(build_dir, ignore_errors=True)
            run(["mvn", "-q", "-B", "-f", str(POM), f"-Dapicurio.version={self.version}",
                 f"-Dhandoff.build.directory={build_dir}",
                 "dependency:unpack-dependencies", f"-DoutputDirectory={tmp}"],
                log=self.home / "build.log")
            if not tmp.exists():
                raise RuntimeError(f"mvn unpacked nothing into {tmp}: see {self.home / 'build.log'}")
            shutil.rmtree(self.app, ignore_errors=True)
            tmp.rename(self.app)
            (self.home / ".built").write_text(self._stamp_value())

    # ---- run ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The Confluent-compatible API base (what `schema.registry.url` / `source.schemaRegistry.url` take)."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    def _start(self, workdir: Path) -> dict[str, str]:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        t0 = time.monotonic()
        self._launch()
        self.startup_seconds = time.monotonic() - t0
        self.env = {"SCHEMA_REGISTRY_URL": self.url}
        return dict(self.env)

    def _launch(self) -> None:
        assert self.workdir is not None
        # In-memory storage (H2 in memory) is the app's default; no auth, no UI redirects, quiet logs.
        # Restart drills are not supported: an in-memory registry forgets its schemas on restart.
        self.service = Service("schema-registry", [
            "java", "-Xmx256m", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
            f"-Dquarkus.http.port={self.port}", "-Dquarkus.http.host=127.0.0.1",
            "-Dquarkus.log.level=WARN", "-Dquarkus.log.category.\"io.quarkus\".level=INFO",
            "-Dregistry.auth.enabled=false",
            "-jar", str(self.runner),
        ], self.workdir / "schema-registry.log", cwd=self.workdir).start()
        wait_until(self._ready, READY_TIMEOUT_S, "schema-registry", self.service, interval=0.5)

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as resp:
            return resp.status == 200 and isinstance(json.loads(resp.read()), list)

    # ---- conveniences for tests ----------------------------------------------------------------
    def client(self):
        """confluent-kafka's SchemaRegistryClient bound to this registry."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

        return SchemaRegistryClient({"url": self.url})
