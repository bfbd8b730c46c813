"""The JVM jars a checkpoint on S3 needs (hadoop-aws and the AWS SDK v2 modules it uses), fetched with Maven into
the test-bed cache once, as the Kafka broker's and the Schema Registry's jars are.

Pinned in hack/hadoop-aws/pom.xml (hadoop-aws 3.5.0, the Hadoop pyspark 4.3 bundles; SDK BOM 2.57.8). A local
driver gets them through `HANDOFF_HADOOP_AWS_JARS=<dir>` (handoff_spark.driver.app.s3_checkpoint_conf adds them to
`spark.jars`); the image puts the same jars into pyspark's own jars directory (Dockerfile).

`python -m handoff_testbed.jars` fetches them if missing and prints the directory; `--write-list` also writes
docker/hadoop-aws-jars.txt (coordinates and sha256 of each jar: what the image build fetches) after a pom change.
"""
from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from .paths import HACK_DIR, REPO_ROOT, cache_dir

POM = HACK_DIR / "hadoop-aws" / "pom.xml"
LISTING = REPO_ROOT / "docker" / "hadoop-aws-jars.txt"
LISTING_HEADER = """\
# The S3A connector for checkpoints on S3 (spec.checkpoint.location s3a://...): what
# `mvn dependency:list -DincludeScope=runtime -f hack/hadoop-aws/pom.xml` resolves, with each jar's sha256.
# The Dockerfile fetches exactly these into pyspark's jars (docker/fetch_jars.py); tests/unit/testbed checks this
# list against the pom's pins and the Hadoop pyspark bundles. Regenerate after changing the pom:
# `PYTHONPATH=hack python -m handoff_testbed.jars --write-list`.
"""
#: The class whose presence proves the S3A file system is among the jars.
S3A_CLASS = "org/apache/hadoop/fs/s3a/S3AFileSystem.class"


def hadoop_aws_jars() -> Path:
    """The directory holding the jars (fetched under a file lock when the pom changed or nothing is there yet)."""
    stamp_text = hashlib.sha256(POM.read_bytes()).hexdigest()
    home = cache_dir() / "hadoop-aws"
    jars = home / "jars"
    stamp = home / ".stamp"
    if stamp.exists() and stamp.read_text() == stamp_text:
        return jars
    if shutil.which("mvn") is None:
        raise RuntimeError("the S3 checkpoint's jars need mvn on PATH (hack/install-system-deps.sh)")
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == stamp_text:
            return jars
        tmp = home / "jars.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        # Maven's build directory in the cache, not hack/hadoop-aws/target (tests/unit/testbed/test_build_state_not_in_git.py)
        subprocess.run(["mvn", "-q", "-B", "-f", str(POM), f"-Dproject.build.directory={home / 'maven-build'}",
                        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={tmp}"],
                       check=True)
        if not any(tmp.glob("hadoop-aws-*.jar")):
            raise RuntimeError(f"mvn copied no hadoop-aws jar into {tmp}")
        shutil.rmtree(jars, ignore_errors=True)
        tmp.rename(jars)
        stamp.write_text(stamp_text)
    return jars


def listing() -> str:
    """docker/hadoop-aws-jars.txt as the pom resolves now: `group:artifact:version sha256` lines, sorted."""
    import re
    import tempfile

    jars = hadoop_aws_jars()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "list.txt"
        subprocess.run(["mvn", "-q", "-B", "-f", str(POM), f"-Dproject.build.directory={Path(tmp) / 'build'}",
                        "dependency:list", "-DincludeScope=runtime", f"-DoutputFile={out}"], check=True)
        resolved = re.findall(r"^\s+([^:\s]+):([^:]+):jar:([^:]+):", out.read_text(), re.M)
    lines = sorted(f"{g}:{a}:{v} {hashlib.sha256((jars / f'{a}-{v}.jar').read_bytes()).hexdigest()}"
                   for g, a, v in resolved)
    return LISTING_HEADER + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(hadoop_aws_jars())
    if "--write-list" in args:
        LISTING.write_text(listing())
        print(f"wrote {LISTING}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
