"""What this process remembers about each handoff between reconciles: one store, one `forget`.

That memory is many small things kept by the modules that need them: the per-object lock and the version last
reconciled (`handoff.handlers`), the rendering of the current spec (`spec.rendered`), the measured rates behind
the scaling decision (`scaling.step`), when the topics' retention was last checked (`retention.step`), the
handoff's phase and Prometheus series (`metrics`), what was applied of its children (`kube.AppliedChildren`).
They were module-level dicts, each cleared by hand on delete, and one was never cleared at all. Here each of
them joins the store (`HandoffStore.join`): a module's dict as a `HandoffMemory`, anything else as a `Part`.
`forget(namespace, name)` (the delete path calls it once, and a reconcile that finds its handoff gone) drops the
handoff from every part; `holding(namespace, name)` says what every part still holds for it.

Imports nothing of the package; imported by the modules whose memory joins it and by `handoff.handlers`.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

Key = tuple[str, str]  # (namespace, handoff name)
T = TypeVar("T")


class Part(Protocol):
    """Memory of handoffs that joins the store."""

    name: str

    def held(self, namespace: str, name: str) -> object | None:
        """What is kept for this handoff (None: nothing)."""

    def forget_handoff(self, namespace: str, name: str) -> None:
        """Keep nothing more for this handoff."""


class HandoffStore:
    """Every part of the process's per-handoff memory. Parts are held weakly: a module's memory lives as long as
    its module, a `Kube`'s record of applied children as long as that `Kube`."""

    def __init__(self) -> None:
        self._parts: weakref.WeakSet[Part] = weakref.WeakSet()  # type: ignore[type-var]
        self._lock = threading.Lock()

    def join(self, part: Part) -> None:
        with self._lock:
            self._parts.add(part)

    def parts(self) -> list[Part]:
        with self._lock:
            return sorted(self._parts, key=lambda p: p.name)

    def holding(self, namespace: str, name: str) -> dict[str, object]:
        """What each part keeps for this handoff, by part name (empty: nothing anywhere)."""
        out: dict[str, object] = {}
        for part in self.parts():
            held = part.held(namespace, name)
            if held is not None:
                out[part.name] = held
        return out

    def forget(self, namespace: str, name: str) -> None:
        """Drop everything kept for this handoff, in every part."""
        for part in self.parts():
            part.forget_handoff(namespace, name)


#: The process's one store.
STORE = HandoffStore()


def forget(namespace: str, name: str) -> None:
    """Forget one handoff everywhere (`STORE.forget`)."""
    STORE.forget(namespace, name)


def holding(namespace: str, name: str) -> dict[str, object]:
    """What is kept for one handoff anywhere (`STORE.holding`)."""
    return STORE.holding(namespace, name)


class HandoffMemory(Generic[T]):
    """One module's memory of each handoff, keyed (namespace, name), thread-safe; it joins `store` as it is made.
    Each call takes the lock once, so a read-modify-write that must be atomic uses `setdefault` or `put_new`."""

    def __init__(self, name: str, store: HandoffStore = STORE) -> None:
        self.name = name
        self._data: dict[Key, T] = {}
        self._lock = threading.Lock()
        store.join(self)

    def get(self, key: Key) -> T | None:
        with self._lock:
            return self._data.get(key)

    def set(self, key: Key, value: T) -> None:
        with self._lock:
            self._data[key] = value

    def setdefault(self, key: Key, make: Callable[[], T]) -> T:
        """The value kept for `key`, made with `make` (under the lock) if there is none."""
        with self._lock:
            value = self._data.get(key)
            if value is None:
                value = self._data[key] = make()
            return value

    def put_new(self, key: Key, value: T) -> bool:
        """Keep `value` unless something is kept for `key` already; whether it was kept."""
        with self._lock:
            if key in self._data:
                return False
            self._data[key] = value
            return True

    def pop(self, key: Key) -> T | None:
        with self._lock:
            return self._data.pop(key, None)

    def values(self) -> list[T]:
        with self._lock:
            return list(self._data.values())

    # -- Part

    def held(self, namespace: str, name: str) -> T | None:
        return self.get((namespace, name))

    def forget_handoff(self, namespace: str, name: str) -> None:
        self.pop((namespace, name))
