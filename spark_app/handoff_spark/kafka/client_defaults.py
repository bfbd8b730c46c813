"""The librdkafka settings every Kafka client of the data plane starts from; a user's `spec.source.properties` win.

`reconnect.backoff.ms` 10 instead of librdkafka's 100. Why: a new client connects to its bootstrap server, learns
the brokers from the first metadata answer and then drops that bootstrap connection, and a request made meanwhile
(the first metadata, offset or coordinator query an application makes right after creating a client) is failed
locally and sent again on a new connection to a broker. librdkafka spaces such new connections by half the
reconnect backoff ("Not selecting any broker for cluster connection: still suppressed for 49ms", its `debug=broker`
log): ~50 ms that every new client waited before its first answer. That is every batch's consumer-group commit
(a new consumer per commit, `offsets`), every Python worker's first range reader (`source.read_range`), the
source's broker queries and the driver's identity check. With 10, that wait is librdkafka's minimum, ~11 ms.
Measured on a loopback broker: a consumer-group commit 60-68 → 8-27 ms, a new reader's metadata 56 → 15 ms
(docs/benchmarks.md, "A new Kafka client's first answer"). The cost: after a broker goes away, the first reconnect
attempts come sooner (10, 20, 40 … ms, up to `reconnect.backoff.max.ms`, 10 s, as before)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Handoff's defaults under every client's own settings.
CLIENT_DEFAULTS: dict[str, str] = {"reconnect.backoff.ms": "10"}


def with_defaults(conf: Mapping[str, Any]) -> dict[str, Any]:
    """`conf` over `CLIENT_DEFAULTS` (what `conf` sets, the user's properties among it, wins)."""
    return {**CLIENT_DEFAULTS, **conf}
