"""The per-handoff memory store (runtime.state): every module's memory of a handoff joins it, and one `forget`
leaves nothing of the handoff anywhere."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import kopf  # noqa: F401 - the handoff controller registers its handlers on import
from kubernetes import client

from handoff_operator.conditions import ProgressFacts
from handoff_operator.handoff import handlers
from handoff_operator.retention import step as retention_step
from handoff_operator.retention.report import RetentionCheck
from handoff_operator.runtime import metrics, state
from handoff_operator.runtime.kube import Kube
from handoff_operator.scaling import step as scaling_step
from handoff_operator.spec import rendered as rendering
from handoff_operator.spec.validation import parse_spec

from operator_support import base_spec  # in tests/integration, which pyproject.toml puts on the path

NS, NAME = "ns-state", "orders"


class _Core:
    def patch_namespaced_config_map(self, *args: Any, **kwargs: Any) -> None:
        return None


def _handoff() -> dict[str, Any]:
    return {"apiVersion": "handoff.io/v1alpha1", "kind": "StreamTableHandoff",
            "metadata": {"name": NAME, "namespace": NS, "uid": "u1", "generation": 1}, "spec": base_spec()}


def _touch_everything(kube: Kube) -> None:
    """Each kind of per-handoff memory, through the code that keeps it."""
    obj = _handoff()
    handlers._lock(NS, NAME)
    kube.get_handoff = lambda namespace, name, plural=None: obj  # type: ignore[method-assign]
    assert handlers._handoff_under_lock(kube, NS, NAME, None) is obj           # the version last read
    handlers._children_due.put_new((NS, NAME), True)                            # a child-triggered reconcile due
    handlers._restarts_seen.set((NS, NAME), ("orders-driver-1", 0))             # the driver's restarts last seen
    handlers._discards_seen.set((NS, NAME), "orders-driver-1")                  # its checkpoint discard recorded
    prepared = rendering.prepare(kube, obj, "img:1")                            # the rendering
    assert prepared.rendered is not None
    kube.applied.remember(prepared.rendered.children[0], time.monotonic())      # an applied child
    spec, _ = parse_spec(obj["spec"])
    assert spec is not None
    kube.core = _Core()  # type: ignore[assignment]
    now_ms, progress = int(time.time() * 1000), ProgressFacts(end_offsets={"t": {"0": 5}})
    measured = scaling_step.measure(NS, NAME, spec, {}, progress, None, 1, now_ms)   # measured rates
    scaling_step.act(kube, NS, NAME, scaling_step.decide_step(spec, {}, progress, None, 1, now_ms, measured))
    retention_step._checked(NS, NAME, spec)                                     # when retention was checked
    metrics.set_phase(NS, NAME, "Running")
    metrics.set_progress(NS, NAME, {"lag": 3, "freshnessSeconds": 1.5, "freshnessTargetSeconds": 60})
    metrics.set_driver_restarts(NS, NAME, 1)
    verdict = SimpleNamespace(topic="t", need_seconds=10, have_seconds=20, headroom_seconds=10)
    metrics.set_retention(NS, NAME, RetentionCheck(0, (verdict,)), [])  # type: ignore[arg-type]


def test_forget_leaves_nothing_of_the_handoff_in_any_part_of_the_store() -> None:
    kube = Kube(client.ApiClient())
    state.forget(NS, NAME)
    assert state.holding(NS, NAME) == {}
    _touch_everything(kube)
    held = state.holding(NS, NAME)
    # Every part the store knows was touched above: a module whose memory joins the store later is named here.
    assert set(held) == {part.name for part in state.STORE.parts()}, held
    assert {"handoff.locks", "handoff.known", "handoff.children_due", "spec.rendered", "scaling",
            "retention.checked", "metrics", "kube.applied", "handoff.restarts_seen",
            "handoff.discards_seen"} <= set(held)
    other = ("ns-state", "orders-other")
    handlers._lock(*other)

    state.forget(NS, NAME)

    assert state.holding(NS, NAME) == {}
    assert "handoff.locks" in state.holding(*other)  # another handoff's memory stays
    state.forget(*other)


def test_a_reconcile_that_finds_its_handoff_gone_forgets_it() -> None:
    """A child's event after the handoff's deletion (the Deployment garbage-collected) reconciles a handoff that is
    gone: that reconcile must not leave its lock (or anything else) behind."""
    kube = Kube(client.ApiClient())
    handlers._lock(NS, NAME)
    metrics.set_phase(NS, NAME, "Running")
    kube.get_handoff = lambda namespace, name, plural=None: None  # type: ignore[method-assign]
    assert handlers.reconcile(NS, NAME, kube, refresh_truth=False) == []
    assert state.holding(NS, NAME) == {}


def test_memory_is_thread_safe_and_kept_per_key() -> None:
    memory: state.HandoffMemory[int] = state.HandoffMemory("test.counter", state.HandoffStore())
    made: list[int] = []

    def make() -> int:
        made.append(1)
        return len(made)

    threads = [threading.Thread(target=memory.setdefault, args=(("a", "b"), make)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert memory.get(("a", "b")) == 1 and made == [1]
    assert memory.put_new(("a", "c"), 5) and not memory.put_new(("a", "c"), 6) and memory.get(("a", "c")) == 5
    assert memory.held("a", "b") == 1
    memory.forget_handoff("a", "b")
    assert memory.get(("a", "b")) is None and sorted(memory.values()) == [5]


def test_parts_are_held_weakly() -> None:
    store = state.HandoffStore()
    memory: state.HandoffMemory[int] = state.HandoffMemory("gone", store)
    assert [p.name for p in store.parts()] == ["gone"]
    del memory
    assert store.parts() == []


def test_the_operator_kube_is_one_per_memo_made_at_first_use(monkeypatch: Any) -> None:
    from handoff_operator.runtime import kube as kube_module

    made: list[object] = []
    monkeypatch.setattr(kube_module, "new_api_client", lambda: made.append(1) or client.ApiClient())
    memo = SimpleNamespace()
    first = kube_module.operator_kube(memo)
    assert kube_module.operator_kube(memo) is first and memo.kube is first and len(made) == 1
    assert kube_module.operator_kube(SimpleNamespace()) is not first
