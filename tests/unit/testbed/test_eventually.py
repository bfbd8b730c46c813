"""handoff_testbed.eventually, the one polling helper of the tests and the test bed: what it returns, what it
retries, and what a failure says (the only thing one has to go on when a test times out)."""
from __future__ import annotations

import pytest

from handoff_testbed.eventually import eventually


def test_returns_the_first_truthy_value() -> None:
    values = iter([None, 0, [], {"phase": "Ready"}])
    assert eventually(lambda: next(values), "ready", timeout=60, interval=0) == {"phase": "Ready"}


def test_retries_the_exceptions_that_mean_not_yet_and_fails_at_once_on_others() -> None:
    calls = iter([KeyError("status"), "done"])

    def check() -> str:
        value = next(calls)
        if isinstance(value, BaseException):
            raise value
        return value

    assert eventually(check, "status written", timeout=60, interval=0, retry_on=(KeyError,)) == "done"
    with pytest.raises(ZeroDivisionError):
        eventually(lambda: 1 / 0, "a bug in the check", timeout=60, interval=0, retry_on=(KeyError,))


def test_a_failure_names_what_and_shows_the_last_value_or_exception_and_the_context() -> None:
    with pytest.raises(AssertionError) as failed:
        eventually(lambda: [], "two pods", timeout=0, interval=0, context=lambda: "--- log ---\nlast line")
    assert str(failed.value).splitlines() == ["never happened within 0 s: two pods", "last value: []",
                                              "--- log ---", "last line"]

    def missing() -> None:
        raise KeyError("conditions")

    with pytest.raises(AssertionError, match=r"(?s)status conditions.*last exception: KeyError: 'conditions'"):
        eventually(missing, "status conditions", timeout=0, interval=0, retry_on=(KeyError,))


def test_give_up_stops_waiting_before_the_timeout() -> None:
    checked: list[int] = []
    with pytest.raises(AssertionError, match="gave up waiting for the operator's write: it exited with 1"):
        eventually(lambda: checked.append(1), "the operator's write", timeout=3600, interval=0,
                   give_up=lambda: "it exited with 1" if checked else None)
    assert checked == [1]
