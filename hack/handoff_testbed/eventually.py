"""`eventually`: poll a check until it holds; the one way the tests and the test bed wait for something that
happens asynchronously (a controller's write, a broker deleting a segment, a component becoming ready).

It lives in the test bed's package, not under tests/, because both use it: the test bed's readiness polling
(`proc.wait_until`) and every test (`hack` is on pytest's path, pyproject.toml). The copies it replaced differed
only in what a failure said; this one always names what never happened and the last thing the check returned or
raised, which is what one needs to tell "too slow" from "wrong"."""
from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")

#: How much of the last value's repr a failure shows (a whole pod list says nothing more than its start).
_SHOWN = 2000


def eventually(check: Callable[[], T | None], what: str, *, timeout: float, interval: float = 0.2,
               retry_on: tuple[type[BaseException], ...] = (),
               give_up: Callable[[], str | None] | None = None,
               context: Callable[[], str] | None = None) -> T:
    """`check()`'s first truthy result, calling it every `interval` seconds for up to `timeout` seconds.

    `timeout` bounds a hang; it measures nothing (no test asserts how soon something happens), so a slow machine
    only makes a passing test slower. `retry_on`: exceptions that mean "not yet" (the API server's 404 for an
    object not created yet, a KeyError for a status field not written yet); any other exception from `check` is
    a failure at once. `give_up()`, asked before each check, returns a reason to stop waiting now (the process
    that was to act has exited) or None. `context()`: more to show on failure, e.g. the tail of a log.

    Raises AssertionError naming `what`, with the last value or exception and `context()`."""
    deadline = time.monotonic() + timeout
    last: str | None = None
    while True:
        reason = give_up() if give_up is not None else None
        if reason is not None:
            raise AssertionError(_failure(f"gave up waiting for {what}: {reason}", last, context))
        try:
            result = check()
        except retry_on as exc:
            last = f"last exception: {type(exc).__name__}: {exc}"
        else:
            if result:
                return result
            last = f"last value: {_shown(result)}"
        if time.monotonic() > deadline:
            raise AssertionError(_failure(f"never happened within {timeout:g} s: {what}", last, context))
        time.sleep(interval)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + " ..."


def _failure(headline: str, last: str | None, context: Callable[[], str] | None) -> str:
    return "\n".join([headline, *([last] if last else []), *([context()] if context is not None else [])])
