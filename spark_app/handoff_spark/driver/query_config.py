"""The operator's query config, applied by the running driver (pure; the read is `driver.hold`'s, the check and the
query's restart are `driver.app`'s).

Why: a change of what the query does (the transform's SQL and lookups, the dedupe's keys and window, the event time's
column, watermark and late-record policy, and adding or removing any of them: the query then switches between the
fused path and the DataFrame path; the declared schema: its columns, evolution, policy and limits; the dead-letter
topic the query's writers produce to; the table's upkeep its commits run, i.e. the replay window's snapshot expiry; the
Kafka servers and topics the source reads, where a new topic starts, the tasks a batch is split into at least and the consumer group its
commits mirror offsets to) or of its pace (the trigger interval, the source's batch size) changes the query, not the JVM, the pod or the executors.
Restarting the pod for it costs a JVM, a Spark session and cold Python workers (~10 s or more on a busy node,
docs/benchmarks.md "Cold start"); restarting the query in the running session costs a batch boundary. So the pod's
config hash leaves them out (`handoff_operator.spec.render.config_hash`), and the operator hands them to the running
driver. The one thing a switch of path does not change is the JVMs' JIT (C1-only for the fused path, C2 for the
DataFrame path: `driver.app.build_session`), fixed at the JVM's launch: it follows at the pod's next start.

Contract with the operator (names in `handoff_spark.contract`):
- the operator writes `QUERY_CONFIG_ANNOTATION` on the progress ConfigMap of every handoff:
  `{"configHash": the whole app config's hash, "podConfigHash": the pod template's, "transform": …, "dedupe": …,
  "eventTime": …, "schema": …, "deadLetterTopic": …, "maintenance": …, "triggerIntervalSeconds": …,
  "maxRecordsPerBatch": …, "eventTimeColumn": …, "bootstrapServers": …, "topics": […], "startingOffsets": …, "minPartitions": …,
  "consumerGroup": …}` (each as in the app config, or null);
- the driver (its pod's own hash in `ENV_POD_CONFIG_HASH`, the downward API) takes it only when `podConfigHash` is
  its own: a config rendered for another pod template belongs to the pod the Deployment rolls out next;
- at start the driver runs the annotation's query config (it may be newer than the pod's mounted app.json); while
  it runs, a new one is checked as a start checks it (`driver.transform.check`; other servers or topics: Kafka answers
  there and has the topics, under the ids the ledger records, `driver.resume.source_problem`): passed, the query stops at a batch
  boundary (another declared schema is reconciled with the table there, as a start does, or refused when the table
  cannot take it: `driver.app.reconcile_schema`), the start is planned again as at a driver's start
  (`driver.resume.prepare_start`: a checkpoint whose
  dedupe state is keyed by other keys is discarded and the window rebuilt from the ledger, `driver.seed`) and the
  query starts again in the same session; failed, the driver keeps the query it runs and says so;
- the driver publishes the config hash it runs and since when (`CONFIG_HASH_KEY`, `CONFIG_SINCE_KEY`), and a
  refused one (`CONFIG_REFUSED_HASH_KEY`, `CONFIG_REFUSED_KEY`): the operator's upgrade rule and conditions read
  them (`handoff_operator.conditions.with_report`).
The ledger's contiguity check guards the table whatever the query does: a batch that does not start where the
ledger ends is refused.
"""
from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from handoff_spark import contract
from handoff_spark.config import AppConfig, Dedupe, EventTime, Maintenance, SchemaPolicy, Transform

log = logging.getLogger("handoff.query_config")

#: The pace's keys (the parts, contract.QUERY_CONFIG_PARTS, are MODELS and DEAD_LETTER_KEY).
PACE_KEYS = tuple(contract.QUERY_CONFIG_PACE)
#: The source's keys the query config carries (its servers and topics, where a new topic starts, the batch's least
#: task count, the consumer group offsets are mirrored to).
SOURCE_KEYS = tuple(contract.QUERY_CONFIG_SOURCE)
#: The parts that are models, and the one that is a plain value (the dead-letter topic, where null means none).
MODELS = {"transform": Transform, "dedupe": Dedupe, "eventTime": EventTime, "schema": SchemaPolicy,
          "maintenance": Maintenance}
DEAD_LETTER_KEY = "deadLetterTopic"
#: Parts the app config always has: null in the annotation means "not carried" (the driver keeps its own).
ALWAYS_SET = ("schema", "maintenance")


@dataclass(frozen=True)
class Pace:
    """The query's trigger interval, the source's batch size and the column freshness is measured on
    (spec.commitInterval, spec.source.maxRecordsPerBatch, eventTime.column or schema.eventTimeColumn)."""

    trigger_interval_seconds: float
    max_records_per_batch: int | None
    event_time_column: str | None = None

    @staticmethod
    def of(cfg: AppConfig) -> "Pace":
        return Pace(cfg.trigger_interval_seconds, cfg.source.max_records_per_batch, cfg.schema_.event_time_column)


@dataclass(frozen=True)
class SourceQuery:
    """The source's settings that are the query's (spec.source.bootstrapServers, topics, startingOffsets,
    minPartitions, consumerGroup; None for the last two: the default, the executors' cores and
    handoff-<handoffId>)."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    starting_offsets: str
    min_partitions: int | None = None
    consumer_group: str | None = None

    @staticmethod
    def of(cfg: AppConfig) -> "SourceQuery":
        src = cfg.source
        return SourceQuery(src.bootstrap_servers, tuple(src.topics), src.starting_offsets, src.min_partitions,
                           src.consumer_group)


@dataclass(frozen=True)
class Wanted:
    """The query config the operator wants this driver to run (`pace` None: the annotation carried none, so the
    driver's own stays)."""

    config_hash: str
    transform: Transform | None
    dedupe: Dedupe | None = None
    event_time: EventTime | None = None
    schema: SchemaPolicy | None = None   # None: the annotation carried none, so the driver's own stays
    pace: Pace | None = None
    dead_letter: DeadLetter | None = None  # None: not carried (the driver's own stays)
    maintenance: Maintenance | None = None  # None: not carried
    source: SourceQuery | None = None  # None: not carried

    def model_parts(self) -> dict[str, Any]:
        """The parts that are models, by their JSON key (MODELS' keys)."""
        return {"transform": self.transform, "dedupe": self.dedupe, "eventTime": self.event_time,
                "schema": self.schema, "maintenance": self.maintenance}

    def runs_in(self, cfg: AppConfig) -> bool:
        """Is this what `cfg` (the app config as declared: without the Schema Registry's columns) runs already?"""
        return ((self.transform, self.dedupe, self.event_time) == (cfg.transform, cfg.dedupe, cfg.event_time)
                and self.schema in (None, cfg.schema_) and self.pace in (None, Pace.of(cfg))
                and self.dead_letter in (None, DeadLetter(cfg.dead_letter_topic))
                and self.maintenance in (None, cfg.maintenance) and self.source in (None, SourceQuery.of(cfg)))


@dataclass(frozen=True)
class DeadLetter:
    """The dead-letter topic a query config carries (`topic` None: the spec has none)."""

    topic: str | None


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
        parts = {key: None if doc.get(key) is None else model.model_validate(doc[key]) for key, model in MODELS.items()}
        pace = _pace(doc)
        dead_letter = _dead_letter(doc)
        source = _source(doc)
    except (ValidationError, TypeError, ValueError) as exc:
        log.warning("the operator's query config is unreadable: %s", str(exc).splitlines()[0])
        return None
    return Wanted(config_hash, parts["transform"], parts["dedupe"], parts["eventTime"],  # type: ignore[arg-type]
                  parts["schema"], pace=pace, dead_letter=dead_letter,  # type: ignore[arg-type]
                  maintenance=parts["maintenance"], source=source)  # type: ignore[arg-type]


def _dead_letter(doc: dict) -> DeadLetter | None:
    """The dead-letter topic the annotation carries, or None when it carries none (an operator that wrote none)."""
    if DEAD_LETTER_KEY not in doc:
        return None
    topic = doc[DEAD_LETTER_KEY]
    if topic is not None and (not isinstance(topic, str) or not topic):
        raise ValueError(f"{DEAD_LETTER_KEY} is {topic!r}, not a topic name or null")
    return DeadLetter(topic)


def _source(doc: dict) -> SourceQuery | None:
    """The source's query settings the annotation carries, or None when it carries none (an operator that wrote
    none). The app config validates them again when applied (`applied`)."""
    if not all(key in doc for key in SOURCE_KEYS):
        return None
    servers, topics, starting = doc["bootstrapServers"], doc["topics"], doc["startingOffsets"]
    parts, group = doc["minPartitions"], doc["consumerGroup"]
    if not isinstance(servers, str) or not servers:
        raise ValueError(f"bootstrapServers is {servers!r}, not a host:port list")
    if not isinstance(topics, list) or not topics or not all(isinstance(t, str) and t for t in topics):
        raise ValueError(f"topics is {topics!r}, not a list of topic names")
    if starting not in ("earliest", "latest"):
        raise ValueError(f"startingOffsets is {starting!r}, not earliest or latest")
    if parts is not None and (isinstance(parts, bool) or not isinstance(parts, int) or parts < 1):
        raise ValueError(f"minPartitions is {parts!r}, not a positive number or null")
    if group is not None and (not isinstance(group, str) or not group):
        raise ValueError(f"consumerGroup is {group!r}, not a group name or null")
    return SourceQuery(servers, tuple(topics), starting, parts, group)


def _pace(doc: dict) -> Pace | None:
    """The pace the annotation carries, or None when it carries none (an operator that wrote none)."""
    if not all(key in doc for key in PACE_KEYS):
        return None
    batch, column = doc["maxRecordsPerBatch"], doc["eventTimeColumn"]
    return Pace(float(doc["triggerIntervalSeconds"]), None if batch is None else int(batch),
                None if column is None else str(column))


def applied(cfg: AppConfig, wanted: Wanted) -> AppConfig:
    """`cfg` running `wanted`, validated as a whole (the app config's own rules hold for it too)."""
    data = json.loads(cfg.to_json())
    for key, part in wanted.model_parts().items():
        if part is None and key in ALWAYS_SET:
            continue  # not carried: the app config always has one
        data[key] = None if part is None else part.model_dump(mode="json", by_alias=True)
    if wanted.dead_letter is not None:
        data[DEAD_LETTER_KEY] = wanted.dead_letter.topic
    if wanted.source is not None:
        data["source"].update(bootstrapServers=wanted.source.bootstrap_servers, topics=list(wanted.source.topics),
                              startingOffsets=wanted.source.starting_offsets,
                              minPartitions=wanted.source.min_partitions, consumerGroup=wanted.source.consumer_group)
    if wanted.pace is not None:
        data["triggerIntervalSeconds"] = wanted.pace.trigger_interval_seconds
        data["source"]["maxRecordsPerBatch"] = wanted.pace.max_records_per_batch
        data.setdefault("schema", {})["eventTimeColumn"] = wanted.pace.event_time_column
    return AppConfig.model_validate(data)
