"""replay.hold: how a Rollback / RollbackAndReplay quiets the stream (the query held in a live driver, else the pod
stopped), and when it may go on. Pure decisions; end to end in tests/e2e/test_operator_replay_drill.py (held in
place) and tests/e2e/test_operator_replay_bigquery_drill.py (a driver that does not publish: the pod path)."""
from __future__ import annotations

from handoff_operator.conditions import DriverReport
from handoff_operator.replay.hold import mode, stopped

NOW = 1_800_000_000_000


def _report(age_s: float = 1.0, pod: str | None = "orders-driver-1", held: str | None = None,
            holding: str | None = None) -> DriverReport:
    return DriverReport(published_at_ms=int(NOW - age_s * 1000), driver_pod=pod, query_held=held,
                        query_holding=holding)


def test_a_driver_that_publishes_now_holds_its_query_in_place() -> None:
    assert mode(_report(), ["orders-driver-1"], NOW, 60) == "query"
    assert mode(_report(pod=None), [], NOW, 60) == "query"  # a driver outside a pod names none


def test_no_live_driver_means_the_pod_is_stopped() -> None:
    assert mode(None, ["orders-driver-1"], NOW, 60) == "pod"  # still starting: nothing published yet
    assert mode(_report(age_s=61), ["orders-driver-1"], NOW, 60) == "pod"  # stopped publishing
    assert mode(_report(), ["orders-driver-2"], NOW, 60) == "pod"  # a report an earlier pod left behind


def test_a_held_query_is_quiet_once_the_driver_says_so_for_this_request() -> None:
    assert not stopped("query", "rewind", _report(), ["orders-driver-1"], 5, 60).done
    assert not stopped("query", "rewind", _report(held="other"), ["orders-driver-1"], 5, 60).done
    quiet = stopped("query", "rewind", _report(held="rewind"), ["orders-driver-1"], 5, 60)
    assert quiet.done and not quiet.escalate and "orders-driver-1" in quiet.message


def test_an_unacknowledged_hold_stops_the_pod_instead() -> None:
    late = stopped("query", "rewind", _report(), ["orders-driver-1"], 60, 60)
    assert late.escalate and not late.done and "60s" in late.message
    # a driver that said it is stopping for this hold (a long batch still running) is waited for, not restarted
    finishing = stopped("query", "rewind", _report(holding="rewind"), ["orders-driver-1"], 600, 60)
    assert not finishing.done and not finishing.escalate and "end of its batch" in finishing.message
    assert stopped("query", "rewind", _report(holding="other"), ["orders-driver-1"], 60, 60).escalate
    # acknowledged late is still acknowledged: no pod restart
    assert stopped("query", "rewind", _report(held="rewind"), ["orders-driver-1"], 300, 60).done


def test_the_pod_path_waits_for_the_pods_to_go() -> None:
    waiting = stopped("pod", "rewind", None, ["orders-driver-1"], 5, 60)
    assert not waiting.done and "orders-driver-1" in waiting.message
    assert stopped("pod", "rewind", None, [], 5, 60).done
