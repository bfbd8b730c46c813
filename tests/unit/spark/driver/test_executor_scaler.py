"""The driver's side of live scaling: the operator's annotation → a count, which executors go on the way
down, new executors warmed before they count, and the source's minPartitions following the warm executors'
cores through a file."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from handoff_spark.contract import DESIRED_EXECUTORS_ANNOTATION as ANNOTATION
from handoff_spark.driver.executor_scaler import ExecutorScaler, parse_desired, surplus, to_apply, write_min_partitions
from handoff_spark.startup.executor_warmup import Executor, WarmUp, partitions_target, to_warm, warmed
from handoff_spark.kafka.source import OffsetRange, SourceOptions, pack_ranges, split_ranges
from handoff_testbed.eventually import eventually


def test_parse_desired_ignores_what_is_not_a_count():
    assert parse_desired({ANNOTATION: "4"}) == 4
    assert parse_desired({ANNOTATION: "0"}) == 0
    assert parse_desired({ANNOTATION: "-1"}) is None
    assert parse_desired({ANNOTATION: "many"}) is None
    assert parse_desired({}) is None and parse_desired(None) is None


def test_surplus_kills_the_newest_executors_first():
    assert surplus(["1", "2", "10", "3"], 2) == ["10", "3"]
    assert surplus(["1", "2"], 2) == [] and surplus(["1"], 3) == []
    assert surplus(["4", "5", "6"], 0) == ["6", "5", "4"]


def test_a_new_count_applies_once_and_extra_executors_are_stopped():
    assert to_apply(3, None, 1) == 3 and to_apply(3, 1, 1) == 3       # a new desired count
    assert to_apply(3, 3, 1) is None and to_apply(3, 3, 3) is None    # asked for; Spark is still starting them
    assert to_apply(1, 1, 2) == 1                                     # one more registered than asked: stop it
    assert to_apply(None, 2, 3) == 2 and to_apply(None, None, 3) is None


def test_the_min_partitions_file_wins_and_is_read_at_each_plan(tmp_path):
    path = tmp_path / "min-partitions"
    opts = SourceOptions.parse({"subscribe": "t", "kafka.bootstrap.servers": "x:1", "minPartitions": "6",
                                "minPartitionsFile": str(path)})
    assert opts.task_bounds()[0] == 6  # no file yet: the start-time value
    ranges = [OffsetRange("t", 0, 0, 240_000)]
    write_min_partitions(str(path), 12)
    assert opts.task_bounds()[0] == 12
    assert len(split_ranges(ranges, opts.task_bounds()[0])) == 12
    write_min_partitions(str(path), 3)  # executors went away: fewer, larger ranges
    assert len(split_ranges(ranges, opts.task_bounds()[0])) == 3
    path.write_text("garbage")
    assert opts.task_bounds()[0] == 6


def test_a_wave_file_asks_for_exactly_that_many_tasks(tmp_path):
    path = tmp_path / "min-partitions"
    opts = SourceOptions.parse({"subscribe": "t", "kafka.bootstrap.servers": "x:1", "minPartitions": "6",
                                "minPartitionsFile": str(path)})
    assert opts.task_bounds() == (6, None)
    write_min_partitions(str(path), 2, one_wave=True)
    assert opts.task_bounds() == (2, 2)
    write_min_partitions(str(path), 9)
    assert opts.task_bounds() == (9, None)


def test_packing_puts_ranges_into_at_most_n_tasks_balanced_and_in_offset_order():
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 0, 60), OffsetRange("t", 2, 0, 50),
              OffsetRange("u", 0, 10, 20)]
    assert pack_ranges(ranges, None) == [[r] for r in ranges]
    assert pack_ranges(ranges, 4) == [[r] for r in ranges]
    two = pack_ranges(ranges, 2)
    assert len(two) == 2 and sorted(sum(two, []), key=ranges.index) == ranges  # every range, once
    assert [sum(r.end - r.start for r in task) for task in two] == [110, 110]
    assert all(task == sorted(task, key=lambda r: (r.topic, r.partition, r.start)) for task in two)
    assert pack_ranges(ranges, 1) == [sorted(ranges, key=lambda r: (r.topic, r.partition, r.start))]


def test_batches_run_one_wave_on_the_warm_cores_while_an_executor_is_cold_or_on_its_way():
    # A driver's start: nothing warm yet, every registered core counts (nothing to protect).
    assert partitions_target(3, {"1": 1, "2": 1}, set(), more_coming=False) == (6, False)
    assert partitions_target(3, {}, set(), more_coming=True) == (3, False)
    # Steady: all warm.
    assert partitions_target(3, {"1": 2}, {"1"}, more_coming=False) == (6, False)
    # Scaling up: asked for, not registered yet; then registered but cold.
    assert partitions_target(3, {"1": 2}, {"1"}, more_coming=True) == (2, True)
    assert partitions_target(3, {"1": 2, "2": 2}, {"1"}, more_coming=False) == (2, True)
    # Warm: its cores count.
    assert partitions_target(3, {"1": 2, "2": 2}, {"1", "2"}, more_coming=False) == (12, False)


def test_warm_up_targets_and_results():
    assert to_warm(["10", "2", "1"], {"1"}, {}, 3) == ["2", "10"]
    assert to_warm(["1", "2"], set(), {"2": 3}, 3) == ["1"]  # given up on after 3 tries
    # A task that ran elsewhere is no warm-up of its target; one that cannot tell (local mode) is.
    assert warmed([WarmUp("2", "2", 1.0, None, 1), WarmUp("3", "1", 1.0, None, 1),
                   WarmUp("4", None, 1.0, None, 1)]) == {"2", "4"}
    assert Executor("7", "10.0.0.9", 2).location == "executor_10.0.0.9_7"


class _Executors:
    """SparkExecutors' surface, over a plain list the test changes."""

    def __init__(self) -> None:
        self.list = [Executor("1", "10.0.0.1", 1)]
        self.requested: list[int] = []
        self.not_alive: set[str] = set()  # registered, not yet offered by the task scheduler

    def ids(self) -> list[str]:
        return [e.id for e in self.list]

    def registered(self) -> list[Executor]:
        return list(self.list)

    def alive(self, executor_id: str) -> bool:
        return executor_id not in self.not_alive

    def request_total(self, n: int) -> bool:
        self.requested.append(n)
        return True

    def kill(self, ids: list[str]) -> bool:
        self.list = [e for e in self.list if e.id not in ids]
        return True

    def cores(self) -> int:
        return sum(e.cores for e in self.list)


def _follow_until(scaler: ExecutorScaler, until: Callable[[], bool]) -> None:
    """Let `scaler` follow its executors until `until()` holds: their warm-ups run in threads of their own."""

    def held() -> bool:
        scaler.follow_executors()
        return until()

    eventually(held, "the scaler's executors settle", timeout=10, interval=0.01)


def test_a_new_executor_counts_for_batches_only_after_its_warm_up(tmp_path):
    path = tmp_path / "min-partitions"
    executors = _Executors()
    release = {e: threading.Event() for e in ("2", "3")}
    calls: list[list[str]] = []

    def warmup(targets: list[Executor]) -> list[tuple[str, str | None]]:
        calls.append([e.id for e in targets])
        for e in targets:
            if e.id in release:
                assert release[e.id].wait(10)
        ran_on = {"3": "1"} if len(calls) == 3 else {}  # the third job's task ran elsewhere: no warm-up of 3
        return [WarmUp(e.id, ran_on.get(e.id, e.id), 1.0, None, 1) for e in targets for _ in range(e.cores)]

    scaler = ExecutorScaler("ns", "cm", executors, min_partitions_file=str(path), partitions_per_core=3,  # type: ignore[arg-type]
                            warmup=warmup, echo=lambda _line: None)

    def settle(until: Callable[[], bool] = lambda: True) -> None:
        _follow_until(scaler, until)
        scaler.follow_executors()  # once more: a warm-up thread may have finished after the last write

    settle(lambda: scaler.warm == {"1"})
    assert calls == [["1"]] and path.read_text() == "3"
    scaler.apply(3)                               # the operator asks for 3: one wave until they are warm
    settle()
    assert executors.requested == [3] and path.read_text() == "1 wave"
    executors.list.append(Executor("2", "10.0.0.2", 1))
    executors.list.append(Executor("3", "10.0.0.3", 1))
    executors.not_alive = {"3"}                   # registered, not offered yet: its job would run anywhere
    settle()
    assert calls[1:] == [["2"]] and path.read_text() == "1 wave"
    executors.not_alive = set()                   # 3 comes alive while 2 still warms: its own job, at once
    settle(lambda: len(calls) == 3)
    assert calls[2] == ["3"] and path.read_text() == "1 wave"
    release["2"].set()
    settle(lambda: scaler.warm == {"1", "2"})
    assert path.read_text() == "2 wave"           # 2 counts; 3 still warming
    release["3"].set()
    settle(lambda: scaler.warm == {"1", "2", "3"})
    assert calls[3:] == [["3"]] and scaler.warmup_failures == {"3": 1}  # its task ran on 1: tried again
    assert path.read_text() == "9"
    scaler.apply(1)                               # down: the newest go, the count follows at once
    settle()
    assert executors.ids() == ["1"] and scaler.warm == {"1"} and path.read_text() == "3"


def test_an_executor_whose_warm_up_keeps_failing_counts_after_three_tries(tmp_path):
    path = tmp_path / "min-partitions"
    executors = _Executors()
    tries: list[str] = []

    def warmup(targets: list[Executor]) -> list[tuple[str, str | None]]:
        tries.extend(e.id for e in targets)
        if any(e.id == "2" for e in targets):
            raise RuntimeError("Python worker failed to start")
        return [WarmUp(e.id, e.id, 1.0, None, 1) for e in targets]

    scaler = ExecutorScaler("ns", "cm", executors, min_partitions_file=str(path), partitions_per_core=3,  # type: ignore[arg-type]
                            warmup=warmup, echo=lambda _line: None)
    executors.list.append(Executor("2", "10.0.0.2", 1))
    _follow_until(scaler, lambda: scaler.warm == {"1", "2"})
    assert tries.count("2") == 3 and scaler.warm == {"1", "2"}
    scaler.follow_executors()
    assert path.read_text() == "6"


def test_an_executor_whose_warm_up_hangs_counts_after_the_timeout(tmp_path, monkeypatch):
    from handoff_spark.driver import executor_scaler

    path = tmp_path / "min-partitions"
    executors = _Executors()
    hang = threading.Event()

    def warmup(targets: list[Executor]) -> list[tuple[str, str | None]]:
        if any(e.id == "2" for e in targets):
            hang.wait(10)  # a catalog that never answers
        return [WarmUp(e.id, e.id, 1.0, None, 1) for e in targets]

    scaler = ExecutorScaler("ns", "cm", executors, min_partitions_file=str(path), partitions_per_core=3,  # type: ignore[arg-type]
                            warmup=warmup, echo=lambda _line: None)
    _follow_until(scaler, lambda: scaler.warm == {"1"})
    executors.list.append(Executor("2", "10.0.0.2", 1))
    scaler.follow_executors()
    scaler.follow_executors()
    assert scaler.warm == {"1"} and path.read_text() == "1 wave"
    monkeypatch.setattr(executor_scaler, "WARMUP_TIMEOUT_SECONDS", 0.0)
    time.sleep(0.01)
    scaler.follow_executors()
    scaler.follow_executors()
    assert scaler.warm == {"1", "2"} and path.read_text() == "6"
    hang.set()


def test_local_mode_is_not_scaled_and_every_cluster_manager_is():
    from handoff_spark.driver.executor_scaler import scalable_master

    for master in ("local", "local[2]", "local[*]", "local[2,3]"):
        assert not scalable_master(master), master
    for master in ("k8s://https://10.0.0.1:443", "local-cluster[2,1,1024]", "spark://h:7077", "yarn"):
        assert scalable_master(master), master
