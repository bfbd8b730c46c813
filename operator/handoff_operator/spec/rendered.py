"""A handoff's spec parsed, checked and rendered once per change, not twice per status refresh (issue 16).

A refresh needs the rendering twice (the app config to read the truth with, outside the per-object lock; the
children to compare with what runs, inside it), and pydantic's validation of the spec plus `render` (the app
config, its JSON, the config hash) cost a few ms each time while the spec almost never changes. The result is
kept per handoff under the exact inputs `render` reads: the owner's uid, the spec as JSON, whether a replay holds
the driver, the default image and the Secret values it resolved (read on every call, as before: a rotated Secret
value renders anew). Anything else, and the entry is rebuilt.

Shared, not copied: callers must not change the Rendered's children (kube.apply sends copies).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from handoff_operator.runtime.kube import AppliedChildren, Kube
from handoff_operator.runtime.state import HandoffMemory
from handoff_operator.models import StreamTableHandoffSpec
from handoff_operator.spec.render import REPLAY_HOLD_ANNOTATION, Rendered, referenced_secrets, render
from handoff_operator.spec.validation import Problem, check, parse_spec


@dataclass(frozen=True)
class Prepared:
    """The typed spec (None: it does not parse), its problems, and its rendering (None: it has problems)."""

    spec: StreamTableHandoffSpec | None
    problems: tuple[Problem, ...]
    rendered: Rendered | None
    digests: tuple[str, ...] = ()           # AppliedChildren.digest of each of rendered.children
    secrets: Mapping[str, Mapping[str, str] | None] = field(default_factory=dict)  # as read for it


#: Per handoff: the inputs it was made from (`_signature`) and the answer.
_cache: HandoffMemory[tuple[tuple[Any, ...], Prepared]] = HandoffMemory("spec.rendered")


def _signature(obj: Mapping[str, Any], spec_json: str, image: str, secrets: Mapping[str, Any]) -> tuple[Any, ...]:
    meta = obj["metadata"]
    return (spec_json, meta.get("uid"), (meta.get("annotations") or {}).get(REPLAY_HOLD_ANNOTATION), image,
            hashlib.sha256(json.dumps(secrets, sort_keys=True).encode()).hexdigest() if secrets else None)


def _build(obj: Mapping[str, Any], image: str, kube: Kube, spec: StreamTableHandoffSpec | None,
           problems: list[Problem], secrets: Mapping[str, Any]) -> Prepared:
    if spec is None:
        return Prepared(None, tuple(problems), None, secrets=secrets)
    resolved, problems = check(obj["metadata"]["name"], spec, secrets)
    if problems:
        return Prepared(spec, tuple(problems), None, secrets=secrets)
    rendered = render(obj, spec, image, resolved)
    return Prepared(spec, (), rendered, tuple(AppliedChildren.digest(c) for c in rendered.children), secrets)


def prepare(kube: Kube, obj: Mapping[str, Any], image: str) -> Prepared:
    """parse_spec → read the Secrets it names → check → render, or the same answer as last time for the same
    inputs (the Secrets are read either way)."""
    meta = obj["metadata"]
    key = (meta["namespace"], meta["name"])
    spec_json = json.dumps(obj.get("spec") or {}, sort_keys=True, default=str)
    problems: list[Problem] = []
    cached = _cache.get(key)
    if cached is not None and cached[0][0] == spec_json and cached[1].spec is not None:
        spec = cached[1].spec  # the same spec parses the same: only the Secrets need reading to know the rest
    else:
        spec, problems = parse_spec(obj.get("spec") or {})
    secrets = kube.read_secrets(meta["namespace"], sorted(referenced_secrets(spec))) if spec is not None else {}
    signature = _signature(obj, spec_json, image, secrets)
    if cached is not None and cached[0] == signature:
        return cached[1]  # the same Secret values it was made with
    prepared = _build(obj, image, kube, spec, problems, secrets)
    _cache.set(key, (signature, prepared))
    return prepared
