"""The broker a benchmark measures against: the one given (`--bootstrap`), or a test-bed Kafka started for the
run and stopped after it."""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[tuple[str, Any]]:
    """(bootstrap servers, the test bed's Kafka or None when `bootstrap` was given)."""
    if bootstrap:
        yield bootstrap, None
        return
    from handoff_testbed.kafka import Kafka

    kafka = Kafka()
    kafka.build()
    try:
        yield kafka.start(Path(tempfile.mkdtemp(prefix="bench-kafka-")))["KAFKA_BOOTSTRAP"], kafka
    finally:
        kafka.stop()
