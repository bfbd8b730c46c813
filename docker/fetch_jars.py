"""Fetch the jars a list names from a Maven repository into a directory, checking each one's sha256.

    python fetch_jars.py <maven repository URL> <list file> <directory>

The list (docker/hadoop-aws-jars.txt) has one `group:artifact:version sha256` a line; `#` starts a comment. Why not
Maven itself in the image build: the image has no Maven, and the pinned list with checksums is the whole of what is
fetched, so a changed or tampered jar fails the build instead of reaching the image. Standard library only (it runs
in the Dockerfile before the app is installed)."""
from __future__ import annotations

import hashlib
import sys
import urllib.request
from pathlib import Path


def parse(text: str) -> list[tuple[str, str, str, str]]:
    """(group, artifact, version, sha256) of every line."""
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        coordinates, digest = line.split()
        group, artifact, version = coordinates.split(":")
        out.append((group, artifact, version, digest.lower()))
    return out


def url(repository: str, group: str, artifact: str, version: str) -> str:
    return f"{repository.rstrip('/')}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.jar"


def fetch(repository: str, listing: Path, target: Path) -> list[Path]:
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for group, artifact, version, digest in parse(listing.read_text()):
        with urllib.request.urlopen(url(repository, group, artifact, version), timeout=120) as response:
            data = response.read()
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise SystemExit(f"{group}:{artifact}:{version}: sha256 {actual}, the list says {digest}")
        path = target / f"{artifact}-{version}.jar"
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
