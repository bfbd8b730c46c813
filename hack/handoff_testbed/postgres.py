"""PostgreSQL (Debian's server binaries) as the durable PyIceberg SQL catalog.

Why a real server next to SQLite: the operator's production catalog is a shared SQL database with
concurrent committers; PostgreSQL row locks and isolation are what PyIceberg's optimistic commits are
tested against. The cluster is throw-away: trust auth on loopback, fsync off.
"""
from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import stat
import tempfile
import time
from pathlib import Path

from .base import ServiceComponent
from .proc import Service, free_port, run, wait_until

UNPRIVILEGED_USER = "nobody"  # initdb/postgres refuse to run as root


def find_bindir() -> Path:
    """Newest /usr/lib/postgresql/<major>/bin with initdb, else wherever `initdb` on PATH resolves."""
    candidates = []
    for path in Path("/usr/lib/postgresql").glob("*/bin/initdb"):
        match = re.fullmatch(r"\d+", path.parent.parent.name)
        if match:
            candidates.append((int(path.parent.parent.name), path.parent))
    if candidates:
        return max(candidates)[1]
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    raise RuntimeError("PostgreSQL server binaries not found: run hack/install-system-deps.sh")


def _reachable_by_others(path: Path) -> bool:
    """True if every ancestor of `path` is searchable by other users (else the unprivileged server
    could not reach its data dir, e.g. a checkout under a 0700 /root)."""
    for parent in [path, *path.parents]:
        if not parent.exists():
            continue
        if not parent.stat().st_mode & stat.S_IXOTH:
            return False
    return True


class Postgres(ServiceComponent):
    """One PostgreSQL cluster on a free loopback port with an `iceberg` database."""

    name = "postgres"
    database = "iceberg"
    stop_timeout = 30.0
    # SIGINT = "fast" shutdown; SIGTERM ("smart") would wait for every client to disconnect.
    stop_signal = signal.SIGINT

    def __init__(self) -> None:
        super().__init__()
        self.port = 0
        self.datadir: Path | None = None
        self._tmp_datadir: Path | None = None
        self.env: dict[str, str] = {}
        self.startup_seconds: float | None = None

    def build(self) -> None:
        """Nothing to build: only checks that the server binaries are installed."""
        find_bindir()

    @property
    def uri(self) -> str:
        """SQLAlchemy URI (what PyIceberg's SqlCatalog takes)."""
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{self.database}"

    @property
    def dsn(self) -> str:
        """libpq DSN for psycopg2.connect."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={self.database}"

    def _as_server_user(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        user = pwd.getpwnam(UNPRIVILEGED_USER)
        return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", *argv]

    def _own(self, path: Path) -> None:
        if os.geteuid() == 0:
            user = pwd.getpwnam(UNPRIVILEGED_USER)
            os.chown(path, user.pw_uid, user.pw_gid)

    def _start(self, workdir: Path) -> dict[str, str]:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        if os.geteuid() == 0 and not _reachable_by_others(self.workdir):
            self._tmp_datadir = Path(tempfile.mkdtemp(prefix="handoff-pg-"))
            os.chmod(self._tmp_datadir, 0o755)
            base = self._tmp_datadir
        else:
            base = self.workdir
        self.datadir = base / "pgdata"
        self.datadir.mkdir(mode=0o700)
        self._own(self.datadir)
        sockets = base / "sockets"
        sockets.mkdir(exist_ok=True)
        self._own(sockets)
        bindir = find_bindir()
        run(self._as_server_user([str(bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres",
                                  "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"]),
            log=self.workdir / "initdb.log")
        self.port = free_port()
        self.service = Service("postgres", self._as_server_user([
            str(bindir / "postgres"), "-D", str(self.datadir), "-h", "127.0.0.1", "-p", str(self.port),
            "-k", str(sockets), "-c", "fsync=off", "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off", "-c", "shared_buffers=64MB", "-c", "max_connections=200",
        ]), self.workdir / "postgres.log").start()
        wait_until(lambda: self._connect("postgres") is not None, 60, "postgres", self.service)
        conn = self._connect("postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {self.database}")
        conn.close()
        self.startup_seconds = time.monotonic() - t0
        self.env = {"ICEBERG_PG_URI": self.uri}
        return dict(self.env)

    def _connect(self, dbname: str):
        import psycopg2

        return psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname,
                                connect_timeout=2)

    def connect(self):
        """A psycopg2 connection to the `iceberg` database (caller closes it)."""
        return self._connect(self.database)

    def stop(self) -> None:
        super().stop()
        if self._tmp_datadir is not None:
            shutil.rmtree(self._tmp_datadir, ignore_errors=True)
            self._tmp_datadir = None
