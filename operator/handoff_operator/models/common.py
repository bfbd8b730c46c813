"""Building blocks shared by the Handoff custom resources: the model base, durations, Kubernetes
quantities, Secret references, offsets maps and status conditions.

Why strings for durations and quantities: the CR must round-trip through the API server unchanged
(`kubectl get -o yaml` shows what the user wrote), so the model keeps the user's text and offers parsed
values through helpers (`parse_duration`, `quantity_to_bytes`) instead of storing numbers.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone
from decimal import Decimal
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer,
                      WithJsonSchema, model_validator)
from pydantic.alias_generators import to_camel

# ---------------------------------------------------------------------------------------------------
# Model bases


class SpecModel(BaseModel):
    """Base of every spec part: camelCase on the wire, unknown fields rejected.

    Unknown fields are an error (not ignored) because the API server prunes them anyway; a typo that
    reaches the model means someone bypassed the CRD, and silently dropping `maxExecutor: 10` would
    run with the default instead of what the user meant.
    """

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              validate_default=True)

    def to_dict(self) -> dict[str, Any]:
        """Wire form: camelCase, JSON types, unset optionals omitted (what a patch or manifest holds)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class StatusModel(BaseModel):
    """Base of every status part. Unknown fields are ignored, not rejected, so an older operator can
    read a status written by a newer one (and the reverse) during a rolling upgrade."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# ---------------------------------------------------------------------------------------------------
# Durations

_DURATION_UNITS: dict[str, float] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0,
                                     "w": 604800.0}
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d|w))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str) -> float:
    """Seconds in a duration like "10s", "5m", "1h30m", "7d", "250ms" (Go units plus d and w).

    Days and weeks are accepted because replay windows and retention are naturally said in days;
    plain numbers are refused because "30" is ambiguous (seconds? minutes?)."""
    if not isinstance(text, str) or not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"invalid duration {text!r}: use e.g. 250ms, 10s, 5m, 1h30m, 7d")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART.findall(text))


def format_duration(seconds: float) -> str:
    """Short human form for status fields and printer columns: 0s, 42s, 3m12s, 2h5m, 3d4h."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        m, sec = divmod(s, 60)
        return f"{m}m{sec}s" if sec else f"{m}m"
    if s < 86400:
        h, rem = divmod(s, 3600)
        m = rem // 60
        return f"{h}h{m}m" if m else f"{h}h"
    d, rem = divmod(s, 86400)
    h = rem // 3600
    return f"{d}d{h}h" if h else f"{d}d"


def _check_duration(text: str) -> str:
    parse_duration(text)
    return text


Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32,
                                examples=["10s", "5m", "7d"]),
                     AfterValidator(_check_duration)]
"""A duration string (kept as written); read it with `parse_duration`."""


# ---------------------------------------------------------------------------------------------------
# Kubernetes quantities (memory)

QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?([eE][0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$"
_QUANTITY_FACTORS: dict[str, Decimal] = {
    "": Decimal(1), "m": Decimal("0.001"),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}


def quantity_to_bytes(text: str) -> int:
    """Bytes in a Kubernetes quantity such as "512Mi", "2Gi", "1.5G", "1e9" (rounded up)."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([eE][0-9]+|[KMGTPE]i|[kMGTPEm])?", str(text))
    if not m:
        raise ValueError(f"invalid quantity {text!r}: use e.g. 512Mi, 2Gi, 1G")
    number, suffix = Decimal(m.group(1)), m.group(2) or ""
    if suffix[:1] in ("e", "E"):
        value = number * (Decimal(10) ** int(suffix[1:]))
    else:
        value = number * _QUANTITY_FACTORS[suffix]
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def spark_memory(text: str) -> str:
    """A quantity in Spark's notation (whole MiB, e.g. "2048m"): Spark does not read "2Gi"."""
    mib = -(-quantity_to_bytes(text) // (1 << 20))
    return f"{max(mib, 1)}m"


def _check_memory(text: str) -> str:
    if quantity_to_bytes(text) < (32 << 20):
        raise ValueError(f"memory {text!r} is below 32Mi; Spark needs far more (e.g. 1Gi)")
    return text


MemoryQuantity = Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=32, examples=["2Gi"]),
                           AfterValidator(_check_memory)]
"""Memory as a Kubernetes quantity ("512Mi", "2Gi"); Spark's form via `spark_memory`."""



#: CPU as Kubernetes writes it: whole cores ("2"), or millicores ("500m", "1.5" = 1500m); nothing finer than a
#: millicore, which Kubernetes would round.
CPU_PATTERN = r"^([0-9]+(\.[0-9]{1,3})?|[0-9]+m)$"


def cpu_millis(text: str) -> int:
    """Millicores of a CPU quantity ("500m" → 500, "1.5" → 1500, "2" → 2000)."""
    if not re.fullmatch(CPU_PATTERN, str(text)):
        raise ValueError(f"invalid CPU quantity {text!r}: use e.g. 500m, 1, 1.5")
    return int(text[:-1]) if text.endswith("m") else int(Decimal(text) * 1000)


def cpu_quantity(millis: int) -> str:
    """Millicores as the API server writes them back (2000 → "2", 1500 → "1500m")."""
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def _check_cpu(text: str) -> str:
    if cpu_millis(text) < 1:
        raise ValueError(f"CPU {text!r} is no CPU; give at least 1m (e.g. 500m)")
    return text


CpuQuantity = Annotated[str, Field(pattern=CPU_PATTERN, max_length=16, examples=["500m", "2"]),
                        AfterValidator(_check_cpu)]
"""CPU as a Kubernetes quantity of at most millicore precision; read it with `cpu_millis`."""


# ---------------------------------------------------------------------------------------------------
# Names and identifiers

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
TOPIC_PATTERN = r"^[A-Za-z0-9._-]+$"

ObjectName = Annotated[str, Field(pattern=DNS_SUBDOMAIN_PATTERN, min_length=1, max_length=253)]
TopicName = Annotated[str, Field(pattern=TOPIC_PATTERN, min_length=1, max_length=249,
                                 description="Kafka topic name.")]


def _int_or_numeric_string(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return value


SnapshotId = Annotated[
    int,
    BeforeValidator(_int_or_numeric_string),
    PlainSerializer(lambda v: str(v), return_type=str, when_used="json"),
    WithJsonSchema({"x-kubernetes-int-or-string": True,
                    "description": "Iceberg snapshot id (an integer; may be written as a string)."}),
]
"""An Iceberg snapshot id: a 63-bit integer. Written to the API as a *string* because JSON tools that
read numbers as doubles (jq, JavaScript UIs) would silently round it; accepted as int or string."""

OffsetsMap = Annotated[
    dict[str, dict[str, Annotated[int, Field(ge=0)]]],
    Field(description="Kafka offsets as {topic: {partition: offset}} (the contract's JSON form; "
                      "partition keys are decimal strings)."),
]


# ---------------------------------------------------------------------------------------------------
# Secret references


class SecretKeyRef(SpecModel):
    """One key of a Secret in the resource's own namespace (never another namespace: that would let
    anyone who can create a handoff read any Secret the operator can read)."""

    name: ObjectName = Field(description="Name of the Secret (same namespace as the resource).")
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$",
                     description="Key within the Secret.")


class SecretRef(SpecModel):
    """A whole Secret in the resource's own namespace."""

    name: ObjectName = Field(description="Name of the Secret (same namespace as the resource).")


class PropertyFrom(SpecModel):
    """Client properties taken from a Secret instead of the spec, so credentials never appear in the
    CR (which many more people and tools can read than Secrets).

    Either `secretRef` (every key of the Secret becomes a property, optionally prefixed) or
    `property` + `secretKeyRef` (one property from one key)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "has(self.secretRef) != has(self.secretKeyRef)",
         "message": "set exactly one of secretRef or secretKeyRef"},
        {"rule": "has(self.secretKeyRef) == has(self.property)",
         "message": "property is required with secretKeyRef (and only with it)"},
        {"rule": "!has(self.prefix) || has(self.secretRef)",
         "message": "prefix only applies to secretRef"},
    ]})

    secret_ref: SecretRef | None = Field(
        default=None, description="Use every key of this Secret as a property (key = property name).")
    prefix: str | None = Field(default=None, max_length=253,
                               description="Prefix added to each key of secretRef, e.g. 'sasl.'.")
    property: str | None = Field(default=None, min_length=1, max_length=253,
                                 description="Property name set from secretKeyRef, e.g. 'sasl.password'.")
    secret_key_ref: SecretKeyRef | None = Field(default=None,
                                                description="Secret key holding the property's value.")

    @model_validator(mode="after")
    def _one_source(self) -> "PropertyFrom":
        if (self.secret_ref is None) == (self.secret_key_ref is None):
            raise ValueError("set exactly one of secretRef or secretKeyRef")
        if (self.secret_key_ref is None) != (self.property is None):
            raise ValueError("property is required with secretKeyRef (and only with it)")
        if self.prefix is not None and self.secret_ref is None:
            raise ValueError("prefix only applies to secretRef")
        return self


# ---------------------------------------------------------------------------------------------------
# Conditions

ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(StatusModel):
    """A status condition with the fields of Kubernetes' metav1.Condition, so kubectl, Argo CD and
    `kubectl wait --for=condition=Ready` understand it."""

    type: str = Field(min_length=1, max_length=316, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?"
                      r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
                      description="Condition type in CamelCase, e.g. Ready, Progressing, Degraded.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(default="Unknown", min_length=1, max_length=1024,
                        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                        description="Machine-readable CamelCase reason for the last transition.")
    message: str = Field(default="", max_length=32768,
                         description="Human-readable details: what is wrong and what to do about it.")
    last_transition_time: datetime = Field(
        default_factory=lambda: datetime.now(timezone.utc).replace(microsecond=0),
        description="When status last changed (not when the condition was last checked).")
    observed_generation: int | None = Field(default=None, ge=0,
                                            description="metadata.generation this condition was computed for.")

    def is_true(self) -> bool:
        return self.status == "True"


CONDITIONS_FIELD_SCHEMA: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}


def find_condition(conditions: list[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


# The API identity every Handoff resource shares; kinds, plurals and name rules sit on each resource's model.
# Everything else (render, handlers, kube, tests) imports these instead of spelling "handoff.io" again.
GROUP = "handoff.io"
VERSION = "v1alpha1"


# The printer columns every Handoff resource starts and ends with (`kubectl get` shows its phase first, its age
# last); each resource puts its own between them.
PHASE_COLUMN: dict[str, Any] = {"name": "Phase", "type": "string", "jsonPath": ".status.phase"}
AGE_COLUMN: dict[str, Any] = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


class CustomResource(BaseModel):
    """A whole custom resource (apiVersion, kind, metadata, spec, status). Subclasses set the CRD
    identity in class variables; `handoff_operator.crd.generate` turns any subclass into a CRD."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    group: ClassVar[str] = GROUP
    version: ClassVar[str] = VERSION
    plural: ClassVar[str]
    singular: ClassVar[str]
    short_names: ClassVar[list[str]] = []
    categories: ClassVar[list[str]] = ["handoff"]
    printer_columns: ClassVar[list[dict[str, Any]]] = []
    scope: ClassVar[str] = "Namespaced"
    # CEL rules on the whole object (the only place that can see metadata.name).
    root_validations: ClassVar[list[dict[str, str]]] = []
    # Spec rules only the model enforces (not expressible in CEL), listed in the API reference.
    operator_checks: ClassVar[list[str]] = []

    api_version: str = Field(default=f"{GROUP}/{VERSION}")
    kind: str
    metadata: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def api_version_str(cls) -> str:
        return f"{cls.group}/{cls.version}"

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
