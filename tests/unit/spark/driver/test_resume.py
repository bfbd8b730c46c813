"""The pure decisions behind "the ledger is the truth": when a checkpoint may be trusted, when a batch may
commit, and when Kafka is not the Kafka the ledger's offsets belong to."""
from __future__ import annotations

import json

from handoff_spark import checkpoint as ckpt
from handoff_spark.ledger.record import (BATCH, EPOCH, Commit, contiguity_problems, identity_problems, incarnations,
                                         newest_identity, of_incarnation)
from handoff_spark.driver.resume import checkpoint_problems, path_problem, state_keys_problem

T0, T1 = ("t", 0), ("t", 1)


def _point(next_start=None, pending=None, pending_end=None):
    return ckpt.ResumePoint("q", next_start, pending, pending_end)


def test_agreeing_checkpoint_is_trusted():
    assert checkpoint_problems(_point({T0: 10, T1: 5}), {T0: 10, T1: 5}, {}) == []


def test_empty_checkpoint_is_trusted_whatever_the_ledger():
    assert checkpoint_problems(_point(), {T0: 10}, {}) == []


def test_pending_batch_that_already_landed_agrees():
    # batch planned [10, 20), committed to the table, Spark crashed before commits/N: the sink will skip it
    point = _point({T0: 10}, pending=3, pending_end={T0: 20})
    assert checkpoint_problems(point, {T0: 20}, {}) == []
    assert checkpoint_problems(point, {T0: 10}, {}) == []


def test_checkpoint_ahead_of_a_rolled_back_table_is_refused():
    problems = checkpoint_problems(_point({T0: 30}), {T0: 10}, {})
    assert problems == ["t[0]: the checkpoint resumes at 30, the table's ledger ends at 10"]


def test_checkpoint_behind_the_table_is_refused():
    assert checkpoint_problems(_point({T0: 5}), {T0: 10}, {})


def test_checkpoint_without_a_partition_the_ledger_has_is_refused():
    assert "does not know the partition" in checkpoint_problems(_point({T0: 10}), {T0: 10, T1: 4}, {})[0]


def test_partition_the_ledger_never_saw_must_not_be_past_where_it_entered():
    # entered at its initial offset 7 and nothing committed: fine; moved to 9 with nothing in the table: refused
    assert checkpoint_problems(_point({T0: 10, T1: 7}), {T0: 10}, {T1: 7}) == []
    assert "holds none of offsets 7..8" in checkpoint_problems(_point({T0: 10, T1: 9}), {T0: 10}, {T1: 7})[0]


def test_contiguity_duplicate_gap_and_new_partition():
    assert contiguity_problems({T0: (10, 20)}, {T0: 10}) == []
    assert "would duplicate" in contiguity_problems({T0: (5, 20)}, {T0: 10})[0]
    assert "would be skipped" in contiguity_problems({T0: (12, 20)}, {T0: 10})[0]
    assert contiguity_problems({T1: (0, 5)}, {T0: 10}) == []  # a partition the ledger never saw
    assert contiguity_problems({T0: (3, 3)}, {T0: 10}) == []  # empty ranges move nothing


def test_identity_mismatch_names_topic_and_cluster():
    assert identity_problems("c1", {"t": "a"}, "c1", {"t": "a"}) == []
    assert identity_problems(None, {}, "c1", {"t": "a"}) == []  # nothing recorded yet
    assert "deleted and recreated" in identity_problems("c1", {"t": "a"}, "c1", {"t": "b"})[0]
    assert "cluster id is c2" in identity_problems("c1", {"t": "a"}, "c2", {"t": "a"})[0]


def _entry(batch, offsets, kind=BATCH, cluster=None, topics=None):
    return Commit(None, 0, "ns/h", "handoff", batch, offsets, 0, 0, None, kind=kind, kafka_cluster_id=cluster,
                  topic_ids=topics)


def test_newest_identity_is_the_newest_recorded_one_per_topic():
    newest_first = [_entry(5, {"t": {0: (9, 12)}}, cluster="c2", topics={"t": "b"}),
                    _entry(4, {"u": {0: (3, 4)}}, cluster="c1", topics={"u": "x"}),
                    _entry(3, {"t": {0: (0, 9)}}, cluster="c1", topics={"t": "a", "u": "x"})]
    assert newest_identity(newest_first) == ("c2", {"t": "b"})  # the newest entry named all its topics: stop
    # an entry written before identities were recorded adds nothing
    assert newest_identity([_entry(1, {"t": {0: (0, 3)}})]) == (None, {})
    assert newest_identity([_entry(2, {"t": {0: (3, 5)}}), _entry(1, {"u": {0: (0, 3)}}, cluster="c", topics={"u": "x"})]) \
        == ("c", {"u": "x"})


def test_incarnation_after_an_epoch_counts_only_the_new_topic_ids_entries():
    epoch = _entry(-1, {"t": {0: (0, 0)}}, EPOCH, "c", {"t": "b", "u": "x"})
    newest_first = [_entry(0, {"t": {0: (0, 7)}}, cluster="c", topics={"t": "b", "u": "x"}), epoch,
                    _entry(9, {"t": {0: (40, 50)}, "u": {0: (5, 6)}}, cluster="c", topics={"t": "a", "u": "x"}),
                    _entry(8, {"t": {0: (0, 40)}})]  # written before identities were recorded
    current = incarnations(newest_first)
    assert current == {"t": "b"}  # u was not recreated: every entry of u counts
    assert [of_incarnation(c, "t", current) for c in newest_first] == [True, True, False, False]
    assert of_incarnation(newest_first[2], "u", current)
    assert incarnations(newest_first[2:]) == {}  # no epoch: every entry counts
    # a second recreation: the newest epoch wins
    again = _entry(-1, {"t": {0: (0, 0)}}, EPOCH, "c", {"t": "c2"})
    assert incarnations([again, *newest_first]) == {"t": "c2"}


def test_bigquery_ledger_end_keeps_to_the_incarnation():
    from handoff_spark.bigquery.ledger import ends

    epoch = _entry(-1, {"t": {0: (0, 0), 1: (0, 0)}}, EPOCH, "c", {"t": "b"})
    newest_first = [_entry(0, {"t": {0: (0, 7)}}, cluster="c", topics={"t": "b"}), epoch,
                    _entry(9, {"t": {0: (40, 50), 1: (0, 30)}}, cluster="c", topics={"t": "a"})]
    assert ends(newest_first, incarnations(newest_first)) == {"t": {0: 7, 1: 0}}
    assert ends(newest_first, {}) == {"t": {0: 50, 1: 30}}  # before the epoch: the highest end
    assert ends(newest_first, {}, query="backfill") == {}


def _offsets_file(path, end):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("v1\n" + json.dumps({"batchWatermarkMs": 0}) + "\n" + json.dumps(end) + "\n")


def test_resume_point_reads_spark_layout(tmp_path):
    cp = str(tmp_path)
    assert ckpt.resume_point(cp).empty
    ckpt.write_initial_offsets(cp, {"t": {"0": 3}})
    assert ckpt.resume_point(cp).next_start == {T0: 3}
    _offsets_file(tmp_path / "offsets" / "0", {"t": {"0": 10}})
    point = ckpt.resume_point(cp)
    assert (point.next_start, point.pending_batch, point.pending_end) == ({T0: 3}, 0, {T0: 10})
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "0").write_text("v1\n{}\n")
    _offsets_file(tmp_path / "offsets" / "1", {"t": {"0": 15}})
    point = ckpt.resume_point(cp)
    assert (point.next_start, point.pending_batch, point.pending_end) == ({T0: 10}, 1, {T0: 15})
    (tmp_path / "commits" / "1").write_text("v1\n{}\n")
    assert ckpt.resume_point(cp) == ckpt.ResumePoint(None, {T0: 15}, None, None)
    (tmp_path / "metadata").write_text('{"id":"abc"}')
    assert ckpt.discard(cp) == ["metadata", "offsets", "commits", "sources"]
    assert ckpt.resume_point(cp).empty and tmp_path.exists()


def test_gaps_inside_a_batch_range_are_found_for_the_ledger(tmp_path):
    cp = str(tmp_path)
    ckpt.append_gap(cp, {"topic": "t", "partition": 0, "from": 12, "to": 20, "detectedAtMs": 1})
    ckpt.append_gap(cp, {"topic": "t", "partition": 1, "from": 2, "to": 4, "detectedAtMs": 1})  # older batch
    assert ckpt.gaps_in(cp, {T0: (12, 30), T1: (5, 9)}) == {"t": {"0": [12, 20]}}
    assert ckpt.gaps_in(str(tmp_path / "none"), {T0: (0, 1)}) == {}


def test_changed_dedupe_keys_are_a_reason_to_discard_the_checkpoint_and_the_same_keys_are_not():
    assert state_keys_problem(["id"], ["id"]) is None
    assert state_keys_problem(None, None) is None
    assert state_keys_problem(["id"], ["id", "region"]) == "dedupe.keys changed from [id] to [id, region]"
    assert state_keys_problem(["id", "region"], ["region", "id"]) is not None  # Spark's key schema is ordered
    assert state_keys_problem(None, ["id"]) == "dedupe.keys changed from none (no dedupe) to [id]"
    assert state_keys_problem(["id"], None) == "dedupe.keys changed from [id] to none (no dedupe)"


def test_a_dedupe_keys_changed_type_is_a_reason_to_discard_and_unknown_types_are_not():
    assert state_keys_problem(["id", "region"], ["id", "region"], {"id": "int", "region": "string"},
                              {"id": "bigint", "region": "string"}) == "dedupe key types changed: id from int to bigint"
    assert state_keys_problem(["id"], ["id"], {"id": "bigint"}, {"id": "bigint"}) is None
    assert state_keys_problem(["id"], ["id"], None, {"id": "bigint"}) is None  # an older checkpoint: names only
    assert state_keys_problem(["id"], ["id"], {"id": "int"}, None) is None  # not planned yet: settled after the check
    assert state_keys_problem(["id"], ["oid"], {"id": "int"}, {"oid": "int"}) == "dedupe.keys changed from [id] to [oid]"


def test_the_recorded_state_keys_round_trip_and_an_old_checkpoint_has_none(tmp_path):
    location = str(tmp_path / "checkpoint")
    (tmp_path / "checkpoint").mkdir()
    assert ckpt.read_state_keys(location) == ckpt.StateKeys(False)
    ckpt.write_state_keys(location, ["id", "region"])
    assert ckpt.read_state_keys(location) == ckpt.StateKeys(True, ["id", "region"])
    ckpt.write_state_keys(location, ["id", "region"], {"id": "bigint", "region": "string"})
    assert ckpt.read_state_keys(location) == ckpt.StateKeys(True, ["id", "region"],
                                                            {"id": "bigint", "region": "string"})
    ckpt.write_state_keys(location, None)
    assert ckpt.read_state_keys(location) == ckpt.StateKeys(True, None)
    ckpt.write_state_keys(location, None, None, rows=False)
    assert ckpt.read_state_keys(location) == ckpt.StateKeys(True, None, None, rows=False)


def test_a_checkpoint_of_the_other_paths_query_is_a_reason_to_discard_and_an_unrecorded_path_is_not():
    """A transform, dedupe or event time added to a handoff on the fused path (or the last one removed) switches its
    query's path: the checkpoint the other path's query wrote is not resumed (driver.query_config)."""
    assert path_problem(False, True) == "the query moved from the fused path to the DataFrame path (a transform, " \
                                        "dedupe or event time)"
    assert path_problem(True, False) == "the query moved from the DataFrame path (a transform, dedupe or event " \
                                        "time) to the fused path"
    assert path_problem(True, True) is None and path_problem(False, False) is None
    assert path_problem(None, True) is None and path_problem(None, False) is None  # written before it was recorded
