"""Pydantic models of the Handoff custom resources (spec + status). The CRDs in `crds/` are generated
from these (`python -m handoff_operator.crd.generate`), so the models are the single source of truth for the
API: field docs, defaults and validation live here. `pod` holds the pod options of the Spark pods
(spec.spark.pod), a faithful subset of Kubernetes' own shapes.

May import: `handoff_spark.config` (the column-type grammar and the record limits: the CRD checks what the decoder
takes). Nothing else of either package, so the models and the CRD generator import without kopf, Kubernetes or Kafka.
Imported by every other folder of the operator.
"""
from handoff_operator.models.common import (GROUP, VERSION, Condition, CustomResource, PropertyFrom, SecretKeyRef, SecretRef, find_condition,
                     format_duration, parse_duration, quantity_to_bytes, spark_memory)
from handoff_operator.models.replay_request import (HandoffRef, ReplayPlan, ReplayProgress, ReplayRequest, ReplayRequestSpec,
                             ReplayRequestStatus, ReplayTarget)
from handoff_operator.models.stream_table_handoff import (AppStatus, BigQuerySinkSpec, CheckpointSpec, ColumnSpec,
                                   CommittedStatus, DeadLetterSpec, ExecutorsStatus, FreshnessSpec,
                                   IcebergCatalogSpec, IcebergSinkSpec, KafkaSourceSpec, LastBatchStatus,
                                   ReplaySpec, DriverSpec, ExecutorSpec, RetentionSpec, ScalingSpec, SchemaSpec, SinkSpec,
                                   SparkSpec, StreamTableHandoff, StreamTableHandoffSpec,
                                   StreamTableHandoffStatus, UpgradeSpec, UpgradeStatus)
from handoff_operator.models.stream_table_handoff import MAX_NAME_LENGTH, NAME_PATTERN

ALL_RESOURCES: tuple[type[CustomResource], ...] = (StreamTableHandoff, ReplayRequest)

__all__ = [
    "ALL_RESOURCES", "GROUP", "VERSION", "MAX_NAME_LENGTH", "NAME_PATTERN", "AppStatus", "BigQuerySinkSpec", "CheckpointSpec", "ColumnSpec", "CommittedStatus",
    "Condition", "CustomResource", "DeadLetterSpec", "ExecutorsStatus", "FreshnessSpec", "HandoffRef",
    "IcebergCatalogSpec", "IcebergSinkSpec", "KafkaSourceSpec", "LastBatchStatus", "PropertyFrom", "ReplayPlan",
    "ReplayProgress", "ReplayRequest", "ReplayRequestSpec", "ReplayRequestStatus", "ReplaySpec",
    "ReplayTarget", "DriverSpec", "ExecutorSpec", "RetentionSpec", "ScalingSpec", "SchemaSpec", "SecretKeyRef",
    "SecretRef", "SinkSpec", "SparkSpec", "StreamTableHandoff", "StreamTableHandoffSpec",
    "StreamTableHandoffStatus", "find_condition", "format_duration", "parse_duration",
    "quantity_to_bytes", "spark_memory", "UpgradeSpec", "UpgradeStatus",
]
