"""The operator's query config, applied by the running driver (pure; the read is `driver.hold`'s, the check and the
query's restart are `driver.app`'s).

Why: a change of the transform alone (its SQL, its lookups) changes what the query does, not the JVM, the pod or
the executors. Restarting the pod for it costs a JVM, a Spark session and cold Python workers (~10 s or more on a
busy node, docs/benchmarks.md "Cold start"); restarting the query in the running session costs a batch boundary.
So the pod's config hash leaves the transform's content out (`handoff_operator.spec.render.config_hash`), and the
operator hands the transform to the running driver instead.

Contract with the operator (names in `handoff_spark.contract`):
- the operator writes `QUERY_CONFIG_ANNOTATION` on the progress ConfigMap when the handoff has a transform:
  `{"configHash": the whole app config's hash, "podConfigHash": the pod template's, "transform": {...}}`;
- the driver (its pod's own hash in `ENV_POD_CONFIG_HASH`, the downward API) takes it only when `podConfigHash` is
  its own: a config rendered for another pod template belongs to the pod the Deployment rolls out next;
- at start the driver runs the annotation's transform (it may be newer than the pod's mounted app.json); while it
  runs, a new one is checked as a start checks it (`driver.transform.check`): passed, the query stops at a batch
  boundary and starts again with it in the same session; failed, the driver keeps the query it runs and says so;
- the driver publishes the config hash it runs and since when (`CONFIG_HASH_KEY`, `CONFIG_SINCE_KEY`), and a
  refused one (`CONFIG_REFUSED_HASH_KEY`, `CONFIG_REFUSED_KEY`): the operator's upgrade rule and conditions read
  them (`handoff_operator.conditions.with_report`).
The ledger's contiguity check guards the table whatever the query does: the restarted query continues from the
same checkpoint, and a batch that does not start where the ledger ends is refused.
"""
from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass

from pydantic import ValidationError

from handoff_spark.config import AppConfig, Transform

log = logging.getLogger("handoff.query_config")


@dataclass(frozen=True)
class Wanted:
    """The query config the operator wants this driver to run."""

    config_hash: str
    transform: Transform


@functools.lru_cache(maxsize=8)
def parse(text: str | None, pod_hash: str | None) -> Wanted | None:
    """The annotation's query config for the pod template `pod_hash`, or None: there is none, this driver does not
    know its pod's hash (not in a pod the operator renders), it was made for another pod template, or it is
    unreadable (logged: the operator wrote it, so that is a bug, never the user's). Cached: the driver asks twice a
    second with the same text, so a bad one is logged once and a good one parsed once."""
    if not text or not pod_hash:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        log.warning("the operator's query config is not JSON: %.200s", text)
        return None
    if not isinstance(doc, dict) or doc.get("podConfigHash") != pod_hash:
        return None
    config_hash = doc.get("configHash")
    if not isinstance(config_hash, str) or not config_hash:
        return None
    try:
        transform = Transform.model_validate(doc.get("transform"))
    except ValidationError as exc:
        log.warning("the operator's query config has no readable transform: %s", str(exc).splitlines()[0])
        return None
    return Wanted(config_hash, transform)


def applied(cfg: AppConfig, wanted: Wanted) -> AppConfig:
    """`cfg` running `wanted`'s transform, validated as a whole (the app config's own rules hold for it too)."""
    data = json.loads(cfg.to_json())
    data["transform"] = wanted.transform.model_dump(mode="json", by_alias=True)
    return AppConfig.model_validate(data)
