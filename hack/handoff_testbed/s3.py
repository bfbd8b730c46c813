"""An S3 endpoint (moto's server mode) for Iceberg warehouses on object storage.

Why moto and not a local directory: object storage has no rename and no directory listing
semantics, and the Iceberg FileIO path (pyarrow's S3 filesystem, signed requests, endpoint
overrides) is the one production uses. moto speaks the S3 REST protocol over HTTP.
"""
from __future__ import annotations

import importlib.util
import sys
import time
import urllib.request
from pathlib import Path

from .base import ServiceComponent
from .proc import Service, free_port, wait_until

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


def _moto_server() -> list[str]:
    """moto's server as `moto_server` runs it, answering `Expect: 100-continue` once (moto_s3_server says why)."""
    return [sys.executable, str(Path(__file__).with_name("moto_s3_server.py"))]


class S3(ServiceComponent):
    name = "s3"
    stop_timeout = 10.0

    def __init__(self) -> None:
        super().__init__()
        self.port = 0
        self.env: dict[str, str] = {}
        self.startup_seconds: float | None = None

    def build(self) -> None:
        """Nothing to build; moto[server] comes with the test dependencies (checked without importing
        it: importing moto costs a second; flask + flask_cors are its `server` extra)."""
        if any(importlib.util.find_spec(mod) is None for mod in ("moto", "flask", "flask_cors")):
            raise RuntimeError("moto[server] is missing from the virtualenv: make venv")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self, workdir: Path) -> dict[str, str]:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.port = free_port()
        self.service = Service("s3", [*_moto_server(), "-H", "127.0.0.1", "-p", str(self.port)],
                               self.workdir / "moto.log").start()
        wait_until(lambda: urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).status == 200,
                   30, "moto s3", self.service)
        self.startup_seconds = time.monotonic() - t0
        self.env = {"S3_ENDPOINT": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                    "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION}
        return dict(self.env)

    # ---- conveniences for tests ----------------------------------------------------------------
    def client(self):
        """A boto3 S3 client bound to this endpoint."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION)

    def create_bucket(self, name: str) -> str:
        """Create a bucket (us-east-1 takes no location constraint); returns `s3://name`."""
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"

    def iceberg_properties(self) -> dict[str, str]:
        """PyIceberg FileIO properties for a catalog whose warehouse lives in this S3."""
        return {"s3.endpoint": self.endpoint, "s3.access-key-id": ACCESS_KEY,
                "s3.secret-access-key": SECRET_KEY, "s3.region": REGION}
