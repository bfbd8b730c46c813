"""A driver's start waits out the table's service instead of failing (the loop is pure: its I/O is passed in).

Why: a catalog (or BigQuery) that does not answer when a driver starts used to fail the driver, and the pod then
crash-looped under the kubelet's back-off (up to 5 minutes between tries, so minutes of delay after the service was
back), and a crash loop of a spec being tried rolled the spec back although nothing was wrong with it. The table's
service being down is not the spec's fault: the driver now waits for it in-process, says so in one line, and
publishes the sink's degraded reason (`CatalogUnavailable`, `BigQueryUnavailable`), which the operator shows as
Degraded (reason SinkDegraded); as soon as the service answers, the start goes on. Only what the sink calls an
outage is waited for (`SinkBackend.is_outage`: a refused or timed-out connection, a locked database, a host name
that does not resolve), and only at the sink's `prepare`, the start's first call to the table (Kafka's checks after
it are not the table's: their errors fail the start as before); anything else fails the start with its own message
as before.

What is published with the reason (`degradedDetail`, in the operator's condition message) is the error itself, in
one line: a dashboard then tells a catalog that is down from one that was never reachable. A host name that does
not resolve is as often a wrong host in the spec as a Service not made yet (or DNS trouble), so that line names the
field that holds it (`SinkBackend.outage_field`), while the driver keeps waiting: a fixed spec rolls the pod, a
Service that appears lets the start go on.
"""
from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: The first wait after a failed try, and the longest (doubling in between).
FIRST_DELAY_SECONDS = 1.0
MAX_DELAY_SECONDS = 30.0


#: What a failed host-name lookup says, as the clients pass on getaddrinfo's answer (libpq, urllib3, gRPC).
NAME_NOT_RESOLVED = ("could not translate host name", "name or service not known", "nameresolutionerror",
                     "failed to resolve", "no address associated with hostname", "dns resolution failed")


def unresolved_host(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from, is a host name that does not resolve."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, socket.gaierror) or any(t in str(cur).lower() for t in NAME_NOT_RESOLVED):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def outage_detail(exc: BaseException, field: str | None = None) -> str:
    """The error in one line (at most ~300 characters of its text); for a host name that does not resolve, the
    spec's field that holds it (`field`) and what to check."""
    text = " ".join(str(exc).split())[:300] or type(exc).__name__
    line = f"{type(exc).__name__}: {text}"
    if field and unresolved_host(exc):
        line += f"; its host name does not resolve: check the host in {field}, or that its Service exists"
    return line


def when_reachable(attempt: Callable[[], T], is_outage: Callable[[BaseException], bool], *, reason: str,
                   what: str, wait: Callable[[float], bool], say: Callable[[str], None],
                   degraded: Callable[[str | None, str | None], None], forget: Callable[[], None] = lambda: None,
                   clock: Callable[[], float] = time.monotonic, field: str | None = None) -> tuple[bool, T | None]:
    """`attempt()` until it returns, waiting between tries while it fails with an outage. Returns (True, its
    result), or (False, None) when `wait` said a stop was asked for (then nothing was started). Any other exception
    is raised. `wait(seconds)`: sleep, True when a stop came; `degraded(reason, detail)`: publish the sink's trouble
    and its error in one line (`outage_detail`; both None once it answered); `forget()`: drop cached clients, so the
    next try connects afresh; `field`: the spec's field that holds the service's address."""
    delay, since = FIRST_DELAY_SECONDS, None
    while True:
        try:
            result = attempt()
        except Exception as exc:  # noqa: BLE001 - classified: an outage waits, anything else is raised
            if not is_outage(exc):
                raise
            first = since is None
            since = clock() if since is None else since
            detail = outage_detail(exc, field)
            if first or delay >= MAX_DELAY_SECONDS:
                say(f"{reason}: {what} did not answer at the driver's start ({detail}); "
                    f"waiting for it, trying again in {delay:.0f} s")
            degraded(reason, detail)
            forget()
            if wait(delay):
                return False, None
            delay = min(delay * 2, MAX_DELAY_SECONDS)
            continue
        if since is not None:
            degraded(None, None)
            say(f"{what} answered again after {clock() - since:.0f} s: the driver's start goes on")
        return True, result
