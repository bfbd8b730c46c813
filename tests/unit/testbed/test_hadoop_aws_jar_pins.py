"""The S3A jars for checkpoints on S3 are pinned together: hadoop-aws at the Hadoop version pyspark bundles (a
mismatch fails at the first s3a:// call with NoSuchMethodError, not at build time), the SDK modules at the pom's BOM,
nothing pyspark already ships (two netty or slf4j versions on one class path), and the image fetches exactly the
list (docker/hadoop-aws-jars.txt) the pom resolves to (tests/integration/testbed/test_hadoop_aws_jars_fetched.py)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pyspark

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "docker"))
import fetch_jars  # noqa: E402 - docker/fetch_jars.py, not a package

sys.path.pop(0)

LISTING = fetch_jars.parse((ROOT / "docker" / "hadoop-aws-jars.txt").read_text())
GCS_LISTING = fetch_jars.parse((ROOT / "docker" / "gcs-connector-jars.txt").read_text())
GCS_POM = (ROOT / "hack" / "gcs-connector" / "pom.xml").read_text()
POM = (ROOT / "hack" / "hadoop-aws" / "pom.xml").read_text()
PYSPARK_JARS = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))


def _pom_property(name: str) -> str:
    match = re.search(rf"<{re.escape(name)}>([^<]+)</", POM)
    assert match, name
    return match.group(1)


def test_hadoop_aws_matches_the_hadoop_pyspark_bundles() -> None:
    (bundled,) = [re.match(r"hadoop-client-api-(.+)\.jar$", n).group(1) for n in PYSPARK_JARS  # type: ignore[union-attr]
                  if n.startswith("hadoop-client-api-")]
    (listed,) = [j.version for j in LISTING if (j.group, j.artifact) == ("org.apache.hadoop", "hadoop-aws")]
    assert listed == _pom_property("hadoop.version") == bundled


def test_sdk_modules_follow_the_poms_bom_and_none_is_the_bundle() -> None:
    sdk = {j.artifact: j.version for j in LISTING if j.group == "software.amazon.awssdk"}
    assert {"s3", "s3-transfer-manager", "apache-client"} <= set(sdk)
    assert set(sdk.values()) == {_pom_property("awssdk.version")}
    assert "bundle" not in sdk  # 686 MB: what the pom excludes


def test_nothing_listed_is_a_jar_pyspark_already_ships() -> None:
    shipped = {re.sub(r"-\d[\w.]*?(-[a-z]+[\w.-]*)?\.jar$", "", n) for n in PYSPARK_JARS}
    clashes = sorted(j.artifact for j in LISTING + GCS_LISTING if j.artifact in shipped)
    assert clashes == [], clashes
    assert not [j for j in LISTING + GCS_LISTING if j.group.startswith(("io.netty", "org.slf4j", "org.apache.httpcomponents"))]


def test_every_line_is_pinned_with_a_sha256() -> None:
    assert len(LISTING) == len({(j.group, j.artifact) for j in LISTING}) >= 30
    assert all(re.fullmatch(r"[0-9a-f]{64}", j.digest) for j in LISTING + GCS_LISTING)


def test_the_image_fetches_the_list_into_pysparks_jars() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY docker/fetch_jars.py docker/hadoop-aws-jars.txt docker/gcs-connector-jars.txt /tmp/jars/" in dockerfile
    for name in ("hadoop-aws-jars.txt", "gcs-connector-jars.txt"):
        assert re.search(rf"fetch_jars\.py \"\$MAVEN_REPO\" /tmp/jars/{re.escape(name)} \"\$jars\"", dockerfile)
    assert "pyspark.__file__" in dockerfile


def test_the_gcs_connector_is_the_poms_one_shaded_jar() -> None:
    """The shaded build, alone: the unshaded jar needs Google's client libraries, gRPC and Guava beside it, which
    would clash with pyspark's own."""
    version = re.search(r"<gcs-connector.version>([^<]+)</", GCS_POM).group(1)  # type: ignore[union-attr]
    assert [(j.group, j.artifact, j.version, j.classifier) for j in GCS_LISTING] == [
        ("com.google.cloud.bigdataoss", "gcs-connector", version, "shaded")]
    assert GCS_LISTING[0].file_name == f"gcs-connector-{version}-shaded.jar"
    assert GCS_LISTING[0].repository_path == (
        f"com/google/cloud/bigdataoss/gcs-connector/{version}/gcs-connector-{version}-shaded.jar")
