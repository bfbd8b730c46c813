"""The S3A jars, fetched for real: what Maven resolves from hack/hadoop-aws/pom.xml (the test bed's copy, which local
drivers use) is exactly docker/hadoop-aws-jars.txt, jar for jar and byte for byte, and the image build's
docker/fetch_jars.py, pointed at the Maven-layout repository `make image` serves, writes those jars and refuses one
whose bytes changed."""
from __future__ import annotations

import functools
import hashlib
import http.server
import shutil
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from handoff_testbed.image import maven_repository
from handoff_testbed.jars import GCS_CONNECTOR, S3A_CLASS, gcs_connector_jars, hadoop_aws_jars, listing

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "docker"))
import fetch_jars  # noqa: E402 - docker/fetch_jars.py, not a package

sys.path.pop(0)

LISTING = ROOT / "docker" / "hadoop-aws-jars.txt"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A loopback HTTP server over a copy of the Maven-layout repository (so a test may tamper with it)."""
    root = tmp_path / "maven"
    shutil.copytree(maven_repository(), root)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", root
    finally:
        server.shutdown()
        server.server_close()


def test_the_list_is_what_maven_resolves_from_the_pom() -> None:
    assert listing() == LISTING.read_text(), "regenerate: python -m handoff_testbed.jars --write-list"
    jars = hadoop_aws_jars()
    fetched = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in jars.glob("*.jar")}
    listed = {jar.file_name: jar.digest for jar in fetch_jars.parse(LISTING.read_text())}
    assert fetched == listed
    with zipfile.ZipFile(next(jars.glob("hadoop-aws-*.jar"))) as jar:
        assert S3A_CLASS in jar.namelist()
    size = sum(p.stat().st_size for p in jars.glob("*.jar"))
    assert size < 20 * 1024 * 1024, size  # the SDK's modules, not its 686 MB bundle


def test_the_image_builds_fetch_writes_the_listed_jars_and_refuses_changed_bytes(
        served: tuple[str, Path], tmp_path: Path) -> None:
    url, root = served
    written = fetch_jars.fetch(url, LISTING, tmp_path / "jars")
    assert sorted(p.name for p in written) == sorted(p.name for p in hadoop_aws_jars().glob("*.jar"))
    gcs = fetch_jars.fetch(url, GCS_CONNECTOR.listing_path, tmp_path / "gcs")
    assert [p.name for p in gcs] == [p.name for p in gcs_connector_jars().glob("*.jar")]
    tampered = next(root.rglob("hadoop-aws-*.jar"))
    tampered.write_bytes(tampered.read_bytes() + b"\0")
    with pytest.raises(SystemExit, match="hadoop-aws:.*sha256"):
        fetch_jars.fetch(url, LISTING, tmp_path / "again")


def test_the_gcs_list_is_what_maven_resolves_and_holds_the_connector() -> None:
    assert listing(GCS_CONNECTOR) == GCS_CONNECTOR.listing_path.read_text(), (
        "regenerate: python -m handoff_testbed.jars --write-list")
    (jar_path,) = gcs_connector_jars().glob("*.jar")
    (listed,) = fetch_jars.parse(GCS_CONNECTOR.listing_path.read_text())
    assert jar_path.name == listed.file_name
    assert hashlib.sha256(jar_path.read_bytes()).hexdigest() == listed.digest
    with zipfile.ZipFile(jar_path) as jar:
        assert GCS_CONNECTOR.proof_class in jar.namelist()
