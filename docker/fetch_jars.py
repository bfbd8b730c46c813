"""Fetch the jars a list names from a Maven repository into a directory, checking each one's sha256.

    python fetch_jars.py <maven repository URL> <list file> <directory>

A list (docker/hadoop-aws-jars.txt, docker/gcs-connector-jars.txt) has one
`group:artifact:version[:classifier] sha256` a line; `#` starts a comment. Why not
Maven itself in the image build: the image has no Maven, and the pinned list with checksums is the whole of what is
fetched, so a changed or tampered jar fails the build instead of reaching the image. Standard library only (it runs
in the Dockerfile before the app is installed)."""
from __future__ import annotations

import hashlib
import sys
import urllib.request
from pathlib import Path
from typing import NamedTuple


class Jar(NamedTuple):
    """One listed jar: `group:artifact:version[:classifier] sha256`."""

    group: str
    artifact: str
    version: str
    digest: str
    classifier: str = ""

    @property
    def file_name(self) -> str:
        """The name Maven gives it (in a repository and in `dependency:copy-dependencies`'s output)."""
        return f"{self.artifact}-{self.version}{'-' + self.classifier if self.classifier else ''}.jar"

    @property
    def repository_path(self) -> str:
        return f"{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.file_name}"


def parse(text: str) -> list[Jar]:
    """Every line's jar."""
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        coordinates, digest = line.split()
        group, artifact, version, *classifier = coordinates.split(":")
        out.append(Jar(group, artifact, version, digest.lower(), *classifier[:1]))
    return out


def url(repository: str, jar: Jar) -> str:
    return f"{repository.rstrip('/')}/{jar.repository_path}"


def fetch(repository: str, listing: Path, target: Path) -> list[Path]:
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for jar in parse(listing.read_text()):
        with urllib.request.urlopen(url(repository, jar), timeout=120) as response:
            data = response.read()
        actual = hashlib.sha256(data).hexdigest()
        if actual != jar.digest:
            raise SystemExit(f"{jar.group}:{jar.artifact}:{jar.version}: sha256 {actual}, the list says {jar.digest}")
        path = target / jar.file_name
        path.write_bytes(data)
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    written = fetch(argv[0], Path(argv[1]), Path(argv[2]))
    print(f"{len(written)} jars, {sum(p.stat().st_size for p in written) // 1024} KiB into {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
