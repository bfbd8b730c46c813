"""The broker a benchmark measures against: the one given (`--bootstrap`), or a test-bed Kafka started for the
run and stopped after it."""
from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


def add_broker_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", help="use this broker instead of starting the test bed's")


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[tuple[str, Any]]:
    """(bootstrap servers, the test bed's Kafka or None when `bootstrap` was given)."""
    if bootstrap:
        yield bootstrap, None
        return
    from handoff_testbed.kafka import Kafka

    kafka = Kafka()
    kafka.build()
    data = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    try:
        yield kafka.start(data)["KAFKA_BOOTSTRAP"], kafka
    finally:
        kafka.stop()
        shutil.rmtree(data, ignore_errors=True)  # the topics' logs: hundreds of MB a run
