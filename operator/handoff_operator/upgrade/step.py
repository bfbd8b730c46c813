"""Automatic rollback of a failed upgrade, in reconcile's three steps: gather the last good spec
(`gather_last_good`), decide (`decide_step`, pure: `upgrade.rule.decide` and which rendering to apply, the
current spec's or the last good spec's while a failed change is rolled back, the Events and the status fields
`lastGoodGeneration`, `upgrade`), act (`act`: store the last good spec, count a rollback).

Where the last good spec lives: the owned ConfigMap `<name>-last-good` (`spec.json`: the handoff's spec as
it was when its driver committed, plus its generation and config hash), written when a spec is marked good
and before the status says so, so the operator can render it again after a restart. It holds the spec, not
the rendered app config: Secret values are resolved again when it is rendered, so none are stored here, and
the children (Deployment, app config) come out exactly as the operator renders any spec.

Beside it, in the same ConfigMap under its own field manager, the spec being tried (`tried.json`, its generation
and config hash), written when a change starts being tried while a last good spec exists. The spec can change again
before the operator has seen the tried one commit (a user applying two changes seconds apart): when its driver
still runs it and a batch of it committed, that copy becomes the last good spec, so a rollback of the newer change
goes back to it and not to the spec before it (`upgrade.rule.decide`, `good_from_tried`).
"""
from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from kubernetes.client.rest import ApiException

from handoff_operator.runtime import metrics
from handoff_operator.conditions import DriverFacts, DriverReport, ProgressFacts
from handoff_operator.runtime.kube import Kube
from handoff_operator.models import StreamTableHandoffSpec
from handoff_operator.spec.render import REPLAY_HOLD_ANNOTATION, Rendered, labels, owner_reference, referenced_secrets, render
from handoff_operator.runtime.settings import OperatorSettings
from handoff_operator.upgrade.rule import UPGRADE_ROLLED_BACK, Decision, RolledBackReason, UpgradeFacts, UpgradeState, decide, overlay
from handoff_operator.spec.validation import check, parse_spec

SPEC_KEY = "spec.json"
TRIED_SPEC_KEY = "tried.json"
TRIED_GENERATION_KEY = "triedGeneration"
TRIED_HASH_KEY = "triedConfigHash"
#: The tried copy's keys have their own server-side-apply field manager: writing one half leaves the other's keys.
TRIED_FIELD_MANAGER = "handoff-operator-tried"
__all__ = ["Step", "TriedCopy", "act", "decide_step", "gather_last_good", "gather_tried", "held_spec",
           "last_good_configmap_name", "overlay", "render_spec"]
log = logging.getLogger("handoff.operator")


def last_good_configmap_name(name: str) -> str:
    return f"{name}-last-good"


# ------------------------------------------------------------------------------ status <-> state

def _ms(text: Any) -> int | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(moment.timestamp() * 1000)


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def state_from_status(status: Mapping[str, Any]) -> UpgradeState:
    up = status.get("upgrade") or {}
    reason = up.get("rolledBackReason")
    return UpgradeState(
        last_good_generation=status.get("lastGoodGeneration"), last_good_hash=up.get("lastGoodConfigHash"),
        trying_generation=up.get("tryingGeneration"), trying_hash=up.get("tryingConfigHash"),
        trying_since_ms=_ms(up.get("tryingSince")),
        rolled_back_generation=up.get("rolledBackGeneration"), rolled_back_hash=up.get("rolledBackConfigHash"),
        rolled_back_reason=reason if reason in get_args(RolledBackReason) else None,
        rolled_back_at_ms=_ms(up.get("rolledBackAt")), message=up.get("message"))


def status_from_state(state: UpgradeState) -> dict[str, Any]:
    """`lastGoodGeneration` and `upgrade`, every key present (null clears it in the merge patch)."""
    return {"lastGoodGeneration": state.last_good_generation, "upgrade": {
        "lastGoodConfigHash": state.last_good_hash,
        "tryingGeneration": state.trying_generation, "tryingConfigHash": state.trying_hash,
        "tryingSince": _iso(state.trying_since_ms),
        "rolledBackGeneration": state.rolled_back_generation, "rolledBackConfigHash": state.rolled_back_hash,
        "rolledBackReason": state.rolled_back_reason, "rolledBackAt": _iso(state.rolled_back_at_ms),
        "message": state.message[:1024] if state.message else None}}


# --------------------------------------------------------------------------- the stored last good spec

@dataclass(frozen=True)
class TriedCopy:
    """The stored copy of a tried spec: its generation, config hash and spec (JSON text, as written)."""

    generation: int
    config_hash: str
    spec_json: str


def _configmap(owner: Mapping[str, Any], data: dict[str, str]) -> dict[str, Any]:
    meta = owner["metadata"]
    name = meta["name"]
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": last_good_configmap_name(name), "namespace": meta["namespace"],
                         "labels": labels(name, "last-good"), "ownerReferences": [owner_reference(owner)]},
            "data": data}


def last_good_configmap(owner: Mapping[str, Any], config_hash: str, copy: TriedCopy | None = None
                        ) -> dict[str, Any]:
    """The last good half of the ConfigMap: `owner`'s spec, or the tried `copy` that became the last good one."""
    if copy is not None:
        return _configmap(owner, {SPEC_KEY: copy.spec_json, "generation": str(copy.generation),
                                  "configHash": copy.config_hash})
    return _configmap(owner, {SPEC_KEY: json.dumps(owner.get("spec") or {}, sort_keys=True),
                              "generation": str(owner["metadata"].get("generation") or 0), "configHash": config_hash})


def tried_configmap(owner: Mapping[str, Any], config_hash: str) -> dict[str, Any]:
    """The tried half of the ConfigMap: `owner`'s spec as the one being tried (applied by TRIED_FIELD_MANAGER)."""
    return _configmap(owner, {TRIED_SPEC_KEY: json.dumps(owner.get("spec") or {}, sort_keys=True),
                              TRIED_GENERATION_KEY: str(owner["metadata"].get("generation") or 0),
                              TRIED_HASH_KEY: config_hash})


def render_spec(kube: Kube, owner: Mapping[str, Any], spec: StreamTableHandoffSpec,
                image: str) -> Rendered | None:
    """The children of `spec` with today's Secret values (None: the spec no longer works, e.g. a Secret
    it names is gone)."""
    secrets = kube.read_secrets(owner["metadata"]["namespace"], sorted(referenced_secrets(spec)))
    resolved, problems = check(owner["metadata"]["name"], spec, secrets)
    return None if problems else render(owner, spec, image, resolved)


def _stored(kube: Kube, owner: Mapping[str, Any]) -> dict[str, str] | None:
    """The ConfigMap's data (None: there is none yet)."""
    meta = owner["metadata"]
    try:
        cm = kube.core.read_namespaced_config_map(last_good_configmap_name(meta["name"]), meta["namespace"])
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(cm.data or {})


def _read_last_good(kube: Kube, owner: Mapping[str, Any]) -> StreamTableHandoffSpec | None:
    meta = owner["metadata"]
    data = _stored(kube, owner)
    if data is None:
        return None
    try:
        raw = json.loads(data.get(SPEC_KEY) or "null")
    except json.JSONDecodeError:
        raw = None
    spec, _ = parse_spec(raw) if isinstance(raw, dict) else (None, [])
    if spec is None:
        log.warning(f"{meta['namespace']}/{meta['name']}: the stored last good spec does not parse; "
                    f"no rollback possible until a spec commits again")
    return spec


def _render_last_good(kube: Kube, owner: Mapping[str, Any], image: str) -> Rendered | None:
    spec = _read_last_good(kube, owner)
    return render_spec(kube, owner, spec, image) if spec is not None else None


def held_spec(kube: Kube, owner: Mapping[str, Any]) -> StreamTableHandoffSpec | None:
    """The last good spec while the status says a rollback holds for the current generation (None: the
    current spec runs). What runs is what the status's truth (the table's ledger, Kafka's offsets) must be
    read with: a rolled back spec may name another table or topic."""
    rolled_back = ((owner.get("status") or {}).get("upgrade") or {}).get("rolledBackGeneration")
    if rolled_back is None or rolled_back != owner["metadata"].get("generation"):
        return None
    return _read_last_good(kube, owner)


# ------------------------------------------------------------------------------------------- step

@dataclass(frozen=True)
class Step:
    """The rollout step of one reconcile, as decided (`decide_step`) before anything is done."""

    decision: Decision
    rendered: Rendered                               # what to apply now
    events: list[tuple[str, str, str]] = field(default_factory=list)
    good_hash: str | None = None                     # markGood: the config hash stored as the last good spec's
    good_copy: TriedCopy | None = None               # markGood of the tried copy: what is stored as the last good
    store_tried: bool = False                        # the current spec starts being tried: store its copy

    @property
    def rolling_back(self) -> bool:
        return self.decision.action == "rollBack"

    def status(self) -> dict[str, Any]:
        return status_from_state(self.decision.state)


def gather_last_good(kube: Kube, owner: Mapping[str, Any], status: Mapping[str, Any], rendered: Rendered,
                     image: str) -> Rendered | None:
    """The last good spec's children, read only when they may be needed: a last good spec is recorded and it is
    not the config running now (None: not needed, or it no longer renders)."""
    last_good_hash = state_from_status(status).last_good_hash
    if last_good_hash is None or last_good_hash == rendered.config_hash:
        return None
    return _render_last_good(kube, owner, image)


def gather_tried(kube: Kube, owner: Mapping[str, Any], status: Mapping[str, Any], rendered: Rendered
                 ) -> TriedCopy | None:
    """The stored copy of the spec tried until now, read only when the spec changed again while it was tried (its
    hash is neither the current spec's nor the last good one's); None: not needed, not stored, or it no longer
    parses as a spec."""
    state = state_from_status(status)
    if state.trying_hash is None or state.trying_hash in (rendered.config_hash, state.last_good_hash):
        return None
    data = _stored(kube, owner) or {}
    try:
        copy = TriedCopy(int(data[TRIED_GENERATION_KEY]), data[TRIED_HASH_KEY], data[TRIED_SPEC_KEY])
        raw = json.loads(copy.spec_json)
    except (KeyError, ValueError):
        return None
    if copy.config_hash != state.trying_hash or not isinstance(raw, dict) or parse_spec(raw)[0] is None:
        return None
    return copy


def decide_step(owner: Mapping[str, Any], spec: StreamTableHandoffSpec, rendered: Rendered,
                status: Mapping[str, Any], report: DriverReport | None, truth: ProgressFacts | None,
                settings: OperatorSettings, now_ms: int, driver: DriverFacts | None,
                last_good: Rendered | None, tried: TriedCopy | None = None) -> Step:
    """Keep, mark good or roll back (pure): the facts from what was gathered (`driver`: the driver before this
    reconcile's children step; `last_good`: `gather_last_good`), `upgrade.rule.decide`, and what it means for
    this reconcile: which rendering to apply and the Events (`tried`: `gather_tried`)."""
    meta = owner["metadata"]
    state = state_from_status(status)
    timeout = spec.upgrade_readiness_timeout_seconds
    facts = UpgradeFacts(
        generation=int(meta.get("generation") or 0), desired_hash=rendered.config_hash,
        desired_pod_hash=rendered.pod_hash,
        suspended=spec.suspend, now_ms=now_ms,
        timeout_seconds=timeout if timeout is not None else settings.upgrade_readiness_timeout,
        crash_restarts=settings.upgrade_crash_restarts, auto_rollback=spec.upgrade.auto_rollback,
        driver=driver, report=report,
        ledger_committed_at_ms=truth.committed_at_ms if truth is not None else None,
        lag=truth.lag if truth is not None else status.get("lag"),
        last_good_available=last_good is not None,
        held=REPLAY_HOLD_ANNOTATION in (meta.get("annotations") or {}),
        tried_stored=tried is not None and tried.config_hash == state.trying_hash)
    decision = decide(facts, state)
    events: list[tuple[str, str, str]] = []
    if decision.action == "markGood" and state.last_good_hash is not None:
        events.append(("Normal", "UpgradeSucceeded", decision.message))
    elif decision.action == "rollBack":
        events.append(("Warning", UPGRADE_ROLLED_BACK, decision.message))
    # decide() runs the last good spec only while it renders (last_good_available).
    runs = last_good if decision.run_last_good and last_good is not None else rendered
    good_hash = None
    if decision.action == "markGood":
        good_hash = decision.state.last_good_hash if decision.good_from_tried else rendered.config_hash
    # A change starts being tried while there is a last good spec to roll back to: its copy is stored.
    new_try = decision.state.trying_hash
    store_tried = (new_try is not None and new_try != state.trying_hash and decision.state.last_good_hash is not None)
    return Step(decision, runs, events, good_hash, good_copy=tried if decision.good_from_tried else None,
                store_tried=store_tried)


def act(kube: Kube, owner: Mapping[str, Any], step: Step) -> None:
    """markGood: store the spec (or the tried copy) as the last good one (before the status says so); rollBack:
    count it; a change starting to be tried: store its copy."""
    meta = owner["metadata"]
    where = f"{meta['namespace']}/{meta['name']}"
    if step.store_tried and step.decision.state.trying_hash is not None:
        kube.apply(tried_configmap(owner, step.decision.state.trying_hash), field_manager=TRIED_FIELD_MANAGER)
    if step.good_hash is not None:
        kube.apply(last_good_configmap(owner, step.good_hash, step.good_copy))
        log.info(f"{where}: {step.decision.message}")
    elif step.rolling_back:
        metrics.UPGRADE_ROLLBACKS.labels(reason=step.decision.state.rolled_back_reason or "").inc()
        log.warning(f"{where}: {step.decision.message}")
