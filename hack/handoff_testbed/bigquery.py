"""The BigQuery emulator (bqemulator 1.4.0): REST (tables, queries) + gRPC (Storage Write/Read API).

Why its own virtualenv: bqemulator pins protobuf<7 while the repo's .venv has protobuf 7 (for the
Google client libraries), so the server runs from `<cache>/bqemulator-1.4.0/venv` and the tests talk
to it only over the wire, exactly as the Spark sink talks to real BigQuery.

Why a launcher (`hack/bqemu_launcher.py`): it turns off the emulator's per-write full-table snapshot
copy, which otherwise makes streaming appends quadratic, and makes the calls into its one DuckDB connection one at a
time (concurrent REST and Storage Write requests deadlocked it: the GIL against DuckDB's connection lock).

Why `--persistent --data-dir`: restart drills need the tables to survive an emulator restart.
"""
from __future__ import annotations

import hashlib
import shutil
import sys
import time
import urllib.request
from pathlib import Path

from .base import ServiceComponent
from .paths import HACK_DIR, cache_dir
from .proc import Service, free_port, run, wait_until

VERSION = "1.4.0"
REQUIREMENTS = HACK_DIR / "bqemulator" / "requirements.txt"
LAUNCHER = HACK_DIR / "bqemu_launcher.py"
PROJECT = "test-project"


class BigQueryEmulator(ServiceComponent):
    """`restart()` keeps ports and data (tables survive: persistent mode)."""

    name = "bigquery"
    stop_timeout = 20.0

    def __init__(self) -> None:
        super().__init__()
        self.root = cache_dir() / f"bqemulator-{VERSION}"
        self.venv = self.root / "venv"
        # HOME for the emulator: DuckDB keeps installed extensions under ~/.duckdb, so the spatial
        # extension installed once by build() is found offline on every start.
        self.home = self.root / "home"
        self.project = PROJECT
        self.rest_port = 0
        self.grpc_port = 0
        self.env: dict[str, str] = {}
        self.startup_seconds: float | None = None

    # ---- build -------------------------------------------------------------------------------
    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def _stamp_value(self) -> str:
        return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()

    def build(self) -> None:
        """Virtualenv from the pinned requirements + the spatial extension installed from its wheel."""
        stamp = self.root / ".built"
        if stamp.exists() and stamp.read_text() == self._stamp_value() and self.python.exists():
            return
        shutil.rmtree(self.venv, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        log = self.root / "build.log"
        uv = Path(sys.executable).parent / "uv"
        if uv.exists():  # ~5x faster than pip on a cold cache
            run([str(uv), "venv", "-q", "--python", sys.executable, str(self.venv)], log=log)
            run([str(uv), "pip", "install", "-q", "--python", str(self.python), "-r", str(REQUIREMENTS)], log=log)
        else:
            run([sys.executable, "-m", "venv", str(self.venv)], log=log)
            run([str(self.python), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], log=log)
        self.home.mkdir(parents=True, exist_ok=True)
        # The emulator runs `INSTALL spatial` at boot, which would download from extensions.duckdb.org;
        # installing the PyPI wheel's copy first makes that a no-op offline.
        run([str(self.python), "-c",
             "import duckdb, glob, os, duckdb_extension_spatial as m;"
             "path, = glob.glob(os.path.join(os.path.dirname(m.__file__), 'extensions', 'v*', 'spatial.duckdb_extension'));"
             "con = duckdb.connect(); con.execute(f\"INSTALL '{path}'\"); con.execute('LOAD spatial')"],
            env={"HOME": str(self.home)}, log=self.root / "extension.log")
        stamp.write_text(self._stamp_value())

    # ---- run ---------------------------------------------------------------------------------
    @property
    def rest_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def grpc_endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _start(self, workdir: Path) -> dict[str, str]:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.rest_port = free_port()
        self.grpc_port = free_port()
        while self.grpc_port == self.rest_port:
            self.grpc_port = free_port()
        t0 = time.monotonic()
        self._launch()
        self.startup_seconds = time.monotonic() - t0
        self.env = {"BQ_REST_ENDPOINT": self.rest_endpoint, "BQ_GRPC_ENDPOINT": self.grpc_endpoint,
                    "BQ_PROJECT": self.project}
        return dict(self.env)

    def _launch(self) -> None:
        assert self.workdir is not None
        data_dir = self.workdir / "data"
        data_dir.mkdir(exist_ok=True)
        self.service = Service("bigquery", [
            str(self.python), str(LAUNCHER), "start",
            "--rest-port", str(self.rest_port), "--grpc-port", str(self.grpc_port),
            "--persistent", "--data-dir", str(data_dir), "--project", self.project,
            "--log-level", "warning",
        ], self.workdir / "bqemulator.log", cwd=self.workdir,
            env={"HOME": str(self.home), "BQEMU_ENABLE_FORMAT_EXTENSIONS": "false"}).start()
        wait_until(self._healthy, 60, "bqemulator", self.service, interval=0.2)

    def _healthy(self) -> bool:
        with urllib.request.urlopen(f"{self.rest_endpoint}/healthz", timeout=1) as resp:
            return resp.status == 200

    # ---- client helpers (the repo's .venv side) ----------------------------------------------
    def bq_client(self):
        """google-cloud-bigquery REST client bound to the emulator (anonymous credentials)."""
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import bigquery

        return bigquery.Client(project=self.project, credentials=AnonymousCredentials(),
                               client_options=ClientOptions(api_endpoint=self.rest_endpoint))

    def write_client(self):
        """Storage Write API client over an insecure gRPC channel (client_options alone would try TLS)."""
        import grpc
        from google.cloud.bigquery_storage_v1 import BigQueryWriteClient
        from google.cloud.bigquery_storage_v1.services.big_query_write.transports import (
            BigQueryWriteGrpcTransport,
        )

        channel = grpc.insecure_channel(self.grpc_endpoint)
        return BigQueryWriteClient(transport=BigQueryWriteGrpcTransport(channel=channel))

    def read_client(self):
        """Storage Read API client over an insecure gRPC channel."""
        import grpc
        from google.cloud.bigquery_storage_v1 import BigQueryReadClient
        from google.cloud.bigquery_storage_v1.services.big_query_read.transports import (
            BigQueryReadGrpcTransport,
        )

        channel = grpc.insecure_channel(self.grpc_endpoint)
        return BigQueryReadClient(transport=BigQueryReadGrpcTransport(channel=channel))

    def table_path(self, dataset: str, table: str) -> str:
        """`projects/…/datasets/…/tables/…`, the parent of write streams."""
        return f"projects/{self.project}/datasets/{dataset}/tables/{table}"

