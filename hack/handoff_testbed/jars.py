"""The JVM jars a checkpoint on an object store needs, fetched with Maven into the test-bed cache once, as the Kafka
broker's and the Schema Registry's jars are:

- S3 (`s3a://`): hadoop-aws and the AWS SDK v2 modules it uses, pinned in hack/hadoop-aws/pom.xml (hadoop-aws 3.5.0,
  the Hadoop pyspark 4.3 bundles; SDK BOM 2.57.8);
- Google Cloud Storage (`gs://`): Google's GCS connector, one shaded jar, pinned in hack/gcs-connector/pom.xml.

A local driver gets them through `HANDOFF_HADOOP_AWS_JARS=<dir>` / `HANDOFF_HADOOP_GCS_JARS=<dir>`
(handoff_spark.driver.app adds them to `spark.jars`); the image puts the same jars into pyspark's own jars directory
(Dockerfile, from the pinned lists docker/*-jars.txt).

`python -m handoff_testbed.jars` fetches them if missing and prints the directories; `--write-list` also writes the
lists (coordinates and sha256 of each jar: what the image build fetches) after a pom change.
"""
from __future__ import annotations

import fcntl
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .paths import HACK_DIR, REPO_ROOT, cache_dir

_REGENERATE = """\
# The Dockerfile fetches exactly these into pyspark's jars (docker/fetch_jars.py); tests/unit/testbed checks this
# list against the pom's pins and the Hadoop pyspark bundles. Regenerate after changing the pom:
# `PYTHONPATH=hack python -m handoff_testbed.jars --write-list`.
"""


@dataclass(frozen=True)
class Connector:
    """One object store's jars: the pom that pins them, the list the image build fetches, and a class whose presence
    proves the file system is among them."""

    name: str
    pom: Path
    listing_path: Path
    proof_class: str
    header: str

    @property
    def home(self) -> Path:
        return cache_dir() / self.name


HADOOP_AWS = Connector(
    "hadoop-aws", HACK_DIR / "hadoop-aws" / "pom.xml", REPO_ROOT / "docker" / "hadoop-aws-jars.txt",
    "org/apache/hadoop/fs/s3a/S3AFileSystem.class",
    "# The S3A connector for checkpoints on S3 (spec.checkpoint.location s3a://...): what\n"
    "# `mvn dependency:list -DincludeScope=runtime -f hack/hadoop-aws/pom.xml` resolves, with each jar's sha256.\n"
    + _REGENERATE)
GCS_CONNECTOR = Connector(
    "gcs-connector", HACK_DIR / "gcs-connector" / "pom.xml", REPO_ROOT / "docker" / "gcs-connector-jars.txt",
    "com/google/cloud/hadoop/fs/gcs/GoogleHadoopFileSystem.class",
    "# Google's GCS connector for checkpoints on Google Cloud Storage (spec.checkpoint.location gs://...): what\n"
    "# `mvn dependency:list -DincludeScope=runtime -f hack/gcs-connector/pom.xml` resolves, with each jar's sha256.\n"
    + _REGENERATE)
CONNECTORS = (HADOOP_AWS, GCS_CONNECTOR)
#: The class whose presence proves the S3A file system is among the jars.
S3A_CLASS = HADOOP_AWS.proof_class
#: A jar `mvn dependency:list` prints: `group:artifact:jar[:classifier]:version:scope`.
_LISTED = re.compile(r"^\s+([^:\s]+):([^:]+):jar:(?:([^:]+):)?([^:]+):(?:compile|runtime)", re.M)


def fetched(connector: Connector) -> Path:
    """The directory holding `connector`'s jars (fetched under a file lock when the pom changed or nothing is there
    yet)."""
    stamp_text = hashlib.sha256(connector.pom.read_bytes()).hexdigest()
    home = connector.home
    jars = home / "jars"
    stamp = home / ".stamp"
    if stamp.exists() and stamp.read_text() == stamp_text:
        return jars
    if shutil.which("mvn") is None:
        raise RuntimeError(f"the {connector.name} jars need mvn on PATH (hack/install-system-deps.sh)")
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == stamp_text:
            return jars
        tmp = home / "jars.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        # Maven's build directory in the cache, not under hack/ (tests/unit/testbed/test_build_state_not_in_git.py)
        subprocess.run(["mvn", "-q", "-B", "-f", str(connector.pom), f"-Dproject.build.directory={home / 'maven-build'}",
                        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={tmp}"],
                       check=True)
        if not any(tmp.glob(f"{connector.name}-*.jar")):
            raise RuntimeError(f"mvn copied no {connector.name} jar into {tmp}")
        shutil.rmtree(jars, ignore_errors=True)
        tmp.rename(jars)
        stamp.write_text(stamp_text)
    return jars


def hadoop_aws_jars() -> Path:
    """The S3A jars' directory (`HANDOFF_HADOOP_AWS_JARS`)."""
    return fetched(HADOOP_AWS)


def gcs_connector_jars() -> Path:
    """The GCS connector's directory (`HANDOFF_HADOOP_GCS_JARS`)."""
    return fetched(GCS_CONNECTOR)


def listing(connector: Connector = HADOOP_AWS) -> str:
    """`connector`'s list as its pom resolves now: `group:artifact:version[:classifier] sha256` lines, sorted."""
    jars = fetched(connector)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "list.txt"
        subprocess.run(["mvn", "-q", "-B", "-f", str(connector.pom), f"-Dproject.build.directory={Path(tmp) / 'build'}",
                        "dependency:list", "-DincludeScope=runtime", f"-DoutputFile={out}"], check=True)
        resolved = _LISTED.findall(out.read_text())
    lines = []
    for group, artifact, classifier, version in resolved:
        name = f"{artifact}-{version}{'-' + classifier if classifier else ''}.jar"
        coordinates = f"{group}:{artifact}:{version}{':' + classifier if classifier else ''}"
        lines.append(f"{coordinates} {hashlib.sha256((jars / name).read_bytes()).hexdigest()}")
    return connector.header + "\n".join(sorted(lines)) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    for connector in CONNECTORS:
        print(fetched(connector))
        if "--write-list" in args:
            connector.listing_path.write_text(listing(connector))
            print(f"wrote {connector.listing_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
