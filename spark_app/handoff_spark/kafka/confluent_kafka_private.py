"""Every confluent-kafka private API Handoff uses, behind one name each, so a confluent-kafka upgrade is checked here.

Why private APIs at all (see the callers):
* `PARTITION_EOF`, `AUTO_OFFSET_RESET` (`KafkaError._PARTITION_EOF`, `KafkaError._AUTO_OFFSET_RESET`): librdkafka's
  local error codes (negative), which confluent-kafka exposes only under underscored names. The range reader tells
  "end of partition" and "offset reset" apart from failures by them, for either reader (`kafka.source.read_range`).
* `librdkafka_path()` (`confluent_kafka.cimpl`, and the file its wheel bundles): the native reader binds to the
  librdkafka confluent-kafka has loaded, so the process holds one copy of it (`kafka_native`); importing the C
  extension maps the library, and the process's memory map names its file.

`PRIVATE_APIS` lists them; tests/unit/spark/test_private_api_fences.py resolves each against the installed version and
finds the library. Pinned: requirements.lock.
"""
from __future__ import annotations

from confluent_kafka import KafkaError

from handoff_spark.private_api import attribute

FENCE = "handoff_spark/kafka/confluent_kafka_private.py"

PRIVATE_APIS = (
    "confluent_kafka.KafkaError._PARTITION_EOF",
    "confluent_kafka.KafkaError._AUTO_OFFSET_RESET",
    "confluent_kafka.cimpl",
)

#: librdkafka's "reached the end of the partition" event (not an error).
PARTITION_EOF: int = attribute(KafkaError, "_PARTITION_EOF", api=PRIVATE_APIS[0], fence=FENCE)
#: librdkafka's "the offset was out of range and auto.offset.reset applied (here: error)" event.
AUTO_OFFSET_RESET: int = attribute(KafkaError, "_AUTO_OFFSET_RESET", api=PRIVATE_APIS[1], fence=FENCE)


def librdkafka_path() -> str:
    """The file of the librdkafka confluent-kafka loaded (its wheel's bundled copy, or the system's it was built
    against). Raises ImportError when none is mapped in this process."""
    import confluent_kafka.cimpl  # noqa: F401 - maps the library into the process

    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.rstrip("\n").split(None, 5)[-1]
            if "/librdkafka" in path and ".so" in path:
                return path
    raise ImportError("confluent-kafka's librdkafka is not mapped in this process")


__all__ = ["PRIVATE_APIS", "PARTITION_EOF", "AUTO_OFFSET_RESET", "librdkafka_path"]
