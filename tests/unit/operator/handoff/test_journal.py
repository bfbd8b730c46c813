"""The timeline record (handoff.journal, pure): which entries a reconcile owes, and the bounded ring."""
from __future__ import annotations

from handoff_operator.handoff import journal


def owed(**kw):
    base = dict(now_ms=1000, generation=1, old_status={"observedGeneration": 1, "app": {"driver": "p1"}},
                new_status={"app": {"driver": "p1"}}, events=[])
    return journal.owed(**{**base, **kw})


def reasons(entries):
    return [e["reason"] for e in entries]


def test_a_steady_reconcile_owes_nothing():
    assert owed() == []
    assert owed(driver_restarts=(2, 2)) == []


def test_a_new_generation_is_a_spec_change():
    [e] = owed(generation=3)
    assert e == {"timeMs": 1000, "type": "Normal", "reason": "SpecChanged", "message": "generation 3 of the spec (was 1)"}
    assert owed(generation=1, old_status={"app": {"driver": "p1"}}) == []  # a first status is no change


def test_driver_pods_start_and_are_replaced():
    assert reasons(owed(old_status={"observedGeneration": 1}, new_status={"app": {"driver": "p1"}})) == [
        "DriverStarted"]
    [e] = owed(new_status={"app": {"driver": "p2"}})
    assert e["reason"] == "DriverReplaced" and "p2 replaced p1" in e["message"]
    assert owed(new_status={"app": {}}) == []  # no pod now: nothing started


def test_a_pod_replaced_within_the_reconcile_that_saw_it_keeps_its_entries():
    """A rollback's reconcile gathered the crash-looping p2 and its Recreate made p3 before the read back: the
    timeline still names p2 (p1 → p2 → p3), and a pod seen and still there is one entry, not two."""
    got = owed(new_status={"app": {"driver": "p3"}}, seen_pod="p2")
    assert [(e["reason"], e["message"].split(" (")[0]) for e in got] == [
        ("DriverReplaced", "driver pod p2 replaced p1"), ("DriverReplaced", "driver pod p3 replaced p2")]
    assert [e["message"].split(" (")[0] for e in owed(new_status={"app": {"driver": "p2"}}, seen_pod="p2")] == [
        "driver pod p2 replaced p1"]
    assert owed(seen_pod="p1") == []
    # p3 came from the rollback this reconcile decided: it follows the rollback's Event, p2 comes before it
    got = owed(new_status={"app": {"driver": "p3"}}, seen_pod="p2",
               events=[("Warning", "UpgradeRolledBack", "generation 3 crash-looped")])
    assert [(e["reason"], e["message"].split(" (")[0]) for e in got] == [
        ("DriverReplaced", "driver pod p2 replaced p1"), ("UpgradeRolledBack", "generation 3 crash-looped"),
        ("DriverReplaced", "driver pod p3 replaced p2")]
    # a pod gathered before the act stays before the Events
    assert reasons(owed(new_status={"app": {"driver": "p2"}}, seen_pod="p2",
                        events=[("Normal", "Scaled", "1 → 2")])) == ["DriverReplaced", "Scaled"]
    # the read back found no live pod, so the status kept p1: p2 is the news, not a return to p1
    assert [e["message"].split(" (")[0] for e in owed(seen_pod="p2")] == ["driver pod p2 replaced p1"]
    assert [e["message"] for e in owed(old_status={"observedGeneration": 1}, new_status={"app": {"driver": "p2"}},
                                       seen_pod="p1")][0] == "driver pod p1 created"


def test_a_container_restart_in_the_same_pod_counts_only_a_rise():
    [e] = owed(driver_restarts=(1, 2), last_termination="OOMKilled")
    assert e["type"] == "Warning" and e["reason"] == "DriverRestarted" and "OOMKilled" in e["message"]
    assert owed(driver_restarts=(None, 2)) == []  # not seen before: no rise known
    assert reasons(owed(new_status={"app": {"driver": "p2"}}, driver_restarts=(1, 2))) == ["DriverReplaced"]


def test_retention_checks_and_events_follow_in_order():
    got = owed(generation=2, retention_checked="RetentionSufficient: ok",
               events=[("Normal", "Scaled", "2 → 3 executors (lag 5000)"), ("Warning", "RolledBack", "x" * 5000)])
    assert reasons(got) == ["SpecChanged", "RetentionChecked", "Scaled", "RolledBack"]
    assert got[2]["message"] == "2 → 3 executors (lag 5000)"
    assert len(got[3]["message"]) == journal.MESSAGE_LIMIT


def test_the_ring_keeps_the_newest_entries_and_reads_back():
    ring = []
    for i in range(journal.LIMIT + 5):
        ring = journal.appended(ring, [journal.entry(i, "Normal", "R", str(i))])
    assert len(ring) == journal.LIMIT and ring[0]["timeMs"] == 5 and ring[-1]["timeMs"] == journal.LIMIT + 4
    assert journal.parse(journal.dumps(ring)) == ring
    assert len(journal.dumps(ring).encode()) < 1 << 20


def test_an_unreadable_record_is_empty():
    assert journal.parse(None) == [] and journal.parse("{") == [] and journal.parse('{"a": 1}') == []
    assert journal.parse('[{"timeMs": "x", "reason": "R"}, {"timeMs": 1, "reason": "R"}]') == [
        {"timeMs": 1, "reason": "R"}]


def test_a_checkpoint_discard_is_recorded_once_per_message():
    [e] = owed(checkpoint_discarded=("p1", "the table was rolled back"))
    assert e["reason"] == "CheckpointDiscarded" and "p1 discarded its checkpoint" in e["message"]
    assert "the table was rolled back" in e["message"]
    ring = journal.appended([], [e])
    again = journal.appended(ring, [{**e, "timeMs": 2000}, journal.entry(2000, "Normal", "Scaled", "x")])
    assert reasons(again) == ["CheckpointDiscarded", "Scaled"]
    assert reasons(journal.appended(again, [journal.entry(3000, "Normal", "Scaled", "x")])) == [
        "CheckpointDiscarded", "Scaled", "Scaled"]  # other reasons repeat: each is a happening


def test_a_retention_check_is_recorded_when_its_verdict_changes():
    """A check runs every 5 minutes: recording each filled the ring of 200 in ~17 quiet hours, and a spec change the
    day before was gone (the timeline drill of issue 35: a third of its rows were the same verdict again)."""
    first = owed(retention_checked="Sufficient: topic t keeps records 1d; headroom 20h")
    assert reasons(first) == ["RetentionChecked"] and first[0]["message"].startswith("Sufficient: topic t")
    assert owed(retention_checked="Sufficient: topic t keeps records 1d; headroom 19h",
                retention_before="Sufficient") == []
    [short] = owed(retention_checked="RetentionTooShort: topic t keeps records only 1h", retention_before="Sufficient")
    assert short["reason"] == "RetentionChecked" and short["message"].startswith("RetentionTooShort:")
    [raised] = owed(retention_checked="RetentionRaised: raised retention.ms of topic t from 1 to 2",
                    retention_before="RetentionTooShort")
    assert raised["message"].startswith("RetentionRaised:")
    # A day of unchanged checks leaves the spec change before them in the ring.
    ring = journal.appended([], owed(generation=2))
    for i in range(24 * 12):
        ring = journal.appended(ring, owed(now_ms=2000 + i, retention_checked=f"Sufficient: headroom {i}",
                                           retention_before="Sufficient"))
    assert reasons(ring) == ["SpecChanged"]
