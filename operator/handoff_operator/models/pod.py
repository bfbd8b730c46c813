"""Pod options of the Spark pods (`spec.spark.pod`, `spec.spark.driver.pod`, `spec.spark.executor.pod`).

Why a faithful subset of the Kubernetes shapes and not free-form objects: the CRD is generated from these models, so
`kubectl explain` and the API server's validation know every field a platform team sets (a typo in
`tolerations[0].efect` is refused at apply, not silently pruned), and the operator renders exactly what the user
wrote into the driver Deployment and the executors' pod template. Every field defaults to unset (None) and nothing
here has a default of its own: what the user did not set is not rendered, so the API server's defaults (a volume's
defaultMode, a toleration's operator) never differ from what the operator applies and nothing fights over them.

Why the merge of a role's block over the shared one works like a strategic merge patch (`PodOptions.overlaid`):
that is what `kubectl patch` and Kustomize users already expect of these very fields.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from handoff_operator.models.common import DNS_LABEL_PATTERN, GROUP, QUANTITY_PATTERN, SpecModel

#: Labels the operator puts on its pods and selects them by; a user label with one of these keys would move a pod
#: out of (or into) a handoff's selector. Any key under the operator's own prefix is refused as well.
RESERVED_LABELS = ("app.kubernetes.io/managed-by", "app.kubernetes.io/part-of", "app.kubernetes.io/component",
                   "spark-role", "spark-app-selector", "spark-exec-id", "spark-app-name",
                   "spark-exec-resourceprofile-id")
RESERVED_PREFIX = f"{GROUP}/"

_LABEL_KEY = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
_NAME = Annotated[str, Field(min_length=1, max_length=253)]
_KEY = Annotated[str, Field(min_length=1, max_length=317)]
_VALUES = Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=64)]


_LABELS_RULE = {"rule": f"self.all(k, !k.startsWith('{RESERVED_PREFIX}') && "
                        f"!(k in [{', '.join(repr(k) for k in RESERVED_LABELS)}]))",
                "message": f"labels must not use the operator's or Spark's own keys ({RESERVED_PREFIX}*, "
                           + ", ".join(RESERVED_LABELS) + ")"}
_ANNOTATIONS_RULE = {"rule": f"self.all(k, !k.startsWith('{RESERVED_PREFIX}'))",
                     "message": f"annotations must not use the operator's own keys ({RESERVED_PREFIX}*)"}


def refused_label_keys(keys: Any) -> list[str]:
    """Label keys a user may not set: the operator and Spark select their pods by them."""
    return sorted(k for k in keys if k.startswith(RESERVED_PREFIX) or k in RESERVED_LABELS)


def refused_annotation_keys(keys: Any) -> list[str]:
    """Annotation keys a user may not set: the operator's config hash (a rollout per change) is one."""
    return sorted(k for k in keys if k.startswith(RESERVED_PREFIX))


# ------------------------------------------------------------------------------------------ scheduling

class Toleration(SpecModel):
    """A Kubernetes toleration (core/v1 Toleration): the pod may run on nodes with a matching taint."""

    key: str | None = Field(default=None, max_length=317, description="Taint key; empty with operator Exists "
                                                                      "matches every taint.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal (Kubernetes' "
                                                                                  "default when unset: Equal).")
    value: str | None = Field(default=None, max_length=63, description="Taint value (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; unset matches every effect.")
    toleration_seconds: int | None = Field(default=None, description="For NoExecute: how long the pod stays "
                                                                     "bound after the taint appears.")


class LabelSelectorRequirement(SpecModel):
    key: _KEY = Field(description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="In, NotIn, Exists, "
                                                                                   "DoesNotExist.")
    values: _VALUES | None = Field(default=None, description="Values for In and NotIn.")


class LabelSelector(SpecModel):
    """A Kubernetes label selector (meta/v1 LabelSelector)."""

    match_labels: dict[str, Annotated[str, Field(max_length=63)]] | None = Field(
        default=None, max_length=64, description="Labels a pod must carry.")
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None, max_length=32, description="Requirements a pod's labels must meet.")


class NodeSelectorRequirement(SpecModel):
    key: _KEY = Field(description="Node label (or field) key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="In, NotIn, Exists, DoesNotExist, Gt, Lt.")
    values: _VALUES | None = Field(default=None, description="Values for In, NotIn, Gt, Lt.")


class NodeSelectorTerm(SpecModel):
    match_expressions: list[NodeSelectorRequirement] | None = Field(
        default=None, max_length=32, description="Requirements on the node's labels.")
    match_fields: list[NodeSelectorRequirement] | None = Field(
        default=None, max_length=32, description="Requirements on the node's fields (metadata.name).")


class NodeSelectorSpec(SpecModel):
    node_selector_terms: list[NodeSelectorTerm] = Field(max_length=32, description="Terms, ORed.")


class PreferredSchedulingTerm(SpecModel):
    weight: int = Field(ge=1, le=100, description="1-100.")
    preference: NodeSelectorTerm = Field(description="The node term preferred.")


class NodeAffinity(SpecModel):
    required_during_scheduling_ignored_during_execution: NodeSelectorSpec | None = Field(
        default=None, description="Nodes the pod must run on.")
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = Field(
        default=None, max_length=32, description="Nodes the pod prefers.")


class PodAffinityTerm(SpecModel):
    label_selector: LabelSelector | None = Field(default=None, description="The pods this term is about.")
    namespaces: list[_NAME] | None = Field(default=None, max_length=64,
                                           description="Their namespaces; default: the pod's own.")
    namespace_selector: LabelSelector | None = Field(default=None, description="Their namespaces, by label.")
    topology_key: _KEY = Field(description="Node label that defines co-location, e.g. "
                                           "topology.kubernetes.io/zone.")


class WeightedPodAffinityTerm(SpecModel):
    weight: int = Field(ge=1, le=100, description="1-100.")
    pod_affinity_term: PodAffinityTerm = Field(description="The term preferred.")


class PodAffinity(SpecModel):
    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        default=None, max_length=32, description="Terms that must hold.")
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = Field(
        default=None, max_length=32, description="Terms preferred.")


class Affinity(SpecModel):
    """Kubernetes affinity (core/v1 Affinity): node affinity, pod affinity and anti-affinity."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity.")
    pod_affinity: PodAffinity | None = Field(default=None, description="Run near these pods.")
    pod_anti_affinity: PodAffinity | None = Field(default=None, description="Run away from these pods.")


class TopologySpreadConstraint(SpecModel):
    """A Kubernetes topology spread constraint (core/v1 TopologySpreadConstraint)."""

    max_skew: int = Field(ge=1, description="Largest allowed difference of matching pods between domains.")
    topology_key: _KEY = Field(description="Node label that defines a domain, e.g. kubernetes.io/hostname.")
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(description="DoNotSchedule or "
                                                                                       "ScheduleAnyway.")
    label_selector: LabelSelector | None = Field(default=None, description="The pods counted.")
    min_domains: int | None = Field(default=None, ge=1, description="Minimum number of eligible domains.")
    node_affinity_policy: Literal["Honor", "Ignore"] | None = Field(default=None, description="Honor or Ignore.")
    node_taints_policy: Literal["Honor", "Ignore"] | None = Field(default=None, description="Honor or Ignore.")
    match_label_keys: list[_KEY] | None = Field(default=None, max_length=16,
                                                description="Pod label keys whose values narrow the selector.")


class LocalObjectReference(SpecModel):
    name: _NAME = Field(description="Name of an object in the handoff's namespace (e.g. an image pull "
                                    "Secret).")


# ------------------------------------------------------------------------------------------ environment

class KeySelector(SpecModel):
    name: _NAME = Field(description="Secret or ConfigMap name (the handoff's namespace).")
    key: str = Field(min_length=1, max_length=253, description="Key in it.")
    optional: bool | None = Field(default=None, description="Start the pod even when it is missing.")


class ObjectFieldSelector(SpecModel):
    field_path: str = Field(min_length=1, max_length=253, description="e.g. metadata.name, status.podIP.")
    api_version: str | None = Field(default=None, max_length=32, description="Default v1.")


class ResourceFieldSelector(SpecModel):
    resource: str = Field(min_length=1, max_length=64, description="e.g. limits.memory.")
    container_name: str | None = Field(default=None, max_length=63, description="Default: this container.")
    divisor: str | None = Field(default=None, max_length=32, pattern=QUANTITY_PATTERN,
                                description="Unit, a quantity (default 1).")


class EnvVarSource(SpecModel):
    """Exactly one of the four."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef), "
                 "has(self.resourceFieldRef)].filter(x, x).size() == 1",
         "message": "valueFrom takes exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef"}]})

    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: ObjectFieldSelector | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(default=None,
                                                             description="A resource of the container.")

    @model_validator(mode="after")
    def _exactly_one(self) -> "EnvVarSource":
        set_ = [f for f in ("secret_key_ref", "config_map_key_ref", "field_ref", "resource_field_ref")
                if getattr(self, f) is not None]
        if len(set_) != 1:
            raise ValueError("valueFrom takes exactly one of secretKeyRef, configMapKeyRef, fieldRef, "
                             "resourceFieldRef")
        return self


class EnvVar(SpecModel):
    """An environment variable (core/v1 EnvVar): value or valueFrom."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!(has(self.value) && has(self.valueFrom))", "message": "env: set value or valueFrom, not both"}]})

    name: str = Field(min_length=1, max_length=256, pattern=_ENV_NAME, description="Variable name.")
    value: str | None = Field(default=None, max_length=32768, description="Its value ($(VAR) is expanded by the "
                                                                          "kubelet).")
    value_from: EnvVarSource | None = Field(default=None, description="Its value from a Secret, ConfigMap or "
                                                                      "the pod.")

    @model_validator(mode="after")
    def _one(self) -> "EnvVar":
        if self.value is not None and self.value_from is not None:
            raise ValueError("env: set value or valueFrom, not both")
        return self


class EnvFromRef(SpecModel):
    name: _NAME = Field(description="Secret or ConfigMap name (the handoff's namespace).")
    optional: bool | None = Field(default=None, description="Start the pod even when it is missing.")


class EnvFromSource(SpecModel):
    """Every key of a Secret or ConfigMap as environment (core/v1 EnvFromSource)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "has(self.secretRef) != has(self.configMapRef)",
         "message": "envFrom takes exactly one of secretRef or configMapRef"}]})

    prefix: str | None = Field(default=None, max_length=253, description="Prefix added to every key.")
    secret_ref: EnvFromRef | None = Field(default=None, description="A Secret.")
    config_map_ref: EnvFromRef | None = Field(default=None, description="A ConfigMap.")

    @model_validator(mode="after")
    def _one(self) -> "EnvFromSource":
        if (self.secret_ref is None) == (self.config_map_ref is None):
            raise ValueError("envFrom takes exactly one of secretRef or configMapRef")
        return self


# ------------------------------------------------------------------------------------------ volumes

class KeyToPath(SpecModel):
    key: str = Field(min_length=1, max_length=253, description="Key in the Secret or ConfigMap.")
    path: str = Field(min_length=1, max_length=4096, pattern=r"^[^/]", description="Relative file path.")
    mode: int | None = Field(default=None, ge=0, le=0o777, description="File mode (decimal, e.g. 256 = 0400).")


class _FilesVolume(SpecModel):
    """What a Secret and a ConfigMap volume share: which keys become which files, and their mode."""

    items: list[KeyToPath] | None = Field(default=None, max_length=64, description="Only these keys, at "
                                                                                   "these paths.")
    default_mode: int | None = Field(default=None, ge=0, le=0o777, description="File mode (decimal).")
    optional: bool | None = Field(default=None, description="Start the pod even when it is missing.")


class SecretVolume(_FilesVolume):
    secret_name: _NAME = Field(description="Secret in the handoff's namespace.")


class ConfigMapVolume(_FilesVolume):
    name: _NAME = Field(description="ConfigMap in the handoff's namespace.")


class EmptyDirVolume(SpecModel):
    medium: Literal["", "Memory"] | None = Field(default=None, description="\"\" (node disk) or Memory.")
    size_limit: str | None = Field(default=None, max_length=32, pattern=QUANTITY_PATTERN,
                                   description="Size limit, a quantity (e.g. 10Gi).")


class Volume(SpecModel):
    """A pod volume (core/v1 Volume), of the kinds a Spark pod needs: secret, configMap or emptyDir (scratch
    space, e.g. for Spark with a read-only root filesystem)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "[has(self.secret), has(self.configMap), has(self.emptyDir)].filter(x, x).size() == 1",
         "message": "a volume takes exactly one of secret, configMap, emptyDir"}]})

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN, description="Volume name "
                                                                                          "(volumeMounts name it).")
    secret: SecretVolume | None = Field(default=None, description="Files from a Secret.")
    config_map: ConfigMapVolume | None = Field(default=None, description="Files from a ConfigMap.")
    empty_dir: EmptyDirVolume | None = Field(default=None, description="An empty directory for the pod's life.")

    @model_validator(mode="after")
    def _one(self) -> "Volume":
        if sum(v is not None for v in (self.secret, self.config_map, self.empty_dir)) != 1:
            raise ValueError("a volume takes exactly one of secret, configMap, emptyDir")
        return self


class VolumeMount(SpecModel):
    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN, description="A volume of `volumes`.")
    mount_path: str = Field(min_length=2, max_length=4096, pattern=r"^/", description="Absolute path in the "
                                                                                      "container.")
    sub_path: str | None = Field(default=None, max_length=4096, description="A path inside the volume.")
    read_only: bool | None = Field(default=None, description="Mount read-only.")


# ------------------------------------------------------------------------------------------ security

class SeccompProfile(SpecModel):
    type: Literal["RuntimeDefault", "Unconfined", "Localhost"] = Field(description="RuntimeDefault, Unconfined "
                                                                                   "or Localhost.")
    localhost_profile: str | None = Field(default=None, max_length=4096, description="For Localhost.")


class Capabilities(SpecModel):
    add: list[Annotated[str, Field(max_length=64)]] | None = Field(default=None, max_length=64,
                                                                    description="Capabilities to add.")
    drop: list[Annotated[str, Field(max_length=64)]] | None = Field(default=None, max_length=64,
                                                                     description="Capabilities to drop, e.g. ALL.")


class PodSecurityContext(SpecModel):
    """The pod's securityContext (a subset of core/v1 PodSecurityContext). The project's image runs as user 185
    (spark), so runAsNonRoot: true works without runAsUser."""

    run_as_user: int | None = Field(default=None, ge=0, description="UID of the containers' processes.")
    run_as_group: int | None = Field(default=None, ge=0, description="GID of the containers' processes.")
    run_as_non_root: bool | None = Field(default=None, description="Refuse to start a container as root.")
    fs_group: int | None = Field(default=None, ge=0, description="Group owning the pod's volumes.")
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] | None = Field(
        default=None, description="OnRootMismatch or Always.")
    supplemental_groups: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, max_length=32,
                                                                          description="More groups.")
    seccomp_profile: SeccompProfile | None = Field(default=None, description="Seccomp profile.")


class ContainerSecurityContext(SpecModel):
    """The Spark container's securityContext (a subset of core/v1 SecurityContext). With readOnlyRootFilesystem,
    Spark's scratch space is the emptyDir volumes Spark mounts itself on executors, and /tmp needs a writable
    volume (an emptyDir mounted at /tmp)."""

    run_as_user: int | None = Field(default=None, ge=0, description="UID of the process.")
    run_as_group: int | None = Field(default=None, ge=0, description="GID of the process.")
    run_as_non_root: bool | None = Field(default=None, description="Refuse to start as root.")
    read_only_root_filesystem: bool | None = Field(default=None, description="Mount the image read-only.")
    allow_privilege_escalation: bool | None = Field(default=None, description="no_new_privs unset.")
    privileged: bool | None = Field(default=None, description="Run privileged.")
    capabilities: Capabilities | None = Field(default=None, description="Capabilities to add or drop.")
    seccomp_profile: SeccompProfile | None = Field(default=None, description="Seccomp profile.")


# ------------------------------------------------------------------------------------------ the block

_LabelMap = dict[Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=63, pattern=_LABEL_VALUE)]]
_AnnotationMap = dict[Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=16384)]]

#: How a role's block is laid over the shared one, per field (docs/operator.md "Pod options"): maps merge by key,
#: keyed lists by their key (a role's entry replaces the shared one of the same key), the rest is replaced whole.
MAP_FIELDS = ("node_selector", "labels", "annotations")
KEYED_LISTS = {"image_pull_secrets": "name", "env": "name", "volumes": "name", "volume_mounts": "mount_path"}
MERGED_OBJECTS = ("pod_security_context", "container_security_context")


class PodOptions(SpecModel):
    """Options of Spark pods. In spec.spark.pod they apply to the driver and the executors; in
    spec.spark.driver.pod or spec.spark.executor.pod to that role, laid over spec.spark.pod field by field, as a
    strategic merge patch would: nodeSelector, labels and annotations merge key by key; env, volumes and
    imagePullSecrets merge by name, volumeMounts by mountPath (the role's entry wins); podSecurityContext and
    containerSecurityContext merge field by field; tolerations, envFrom, topologySpreadConstraints, affinity and
    priorityClassName set in the role replace the shared ones whole ([] clears a list for that role). Only what is
    set is rendered: into the driver Deployment's pod template, and into the executors' pod template (Spark's
    spark.kubernetes.executor.podTemplateFile, a file of the ConfigMap <name>-app)."""

    node_selector: dict[Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=63)]] | None = Field(
        default=None, max_length=32, description="Node labels the pod's node must have (merged key by key).")
    tolerations: list[Toleration] | None = Field(default=None, max_length=32,
                                                 description="Taints the pod tolerates (replaced whole by a role).")
    affinity: Affinity | None = Field(default=None, description="Node and pod (anti-)affinity (replaced whole "
                                                                "by a role).")
    topology_spread_constraints: list[TopologySpreadConstraint] | None = Field(
        default=None, max_length=16, description="How pods spread over zones or nodes (replaced whole by a role).")
    priority_class_name: str | None = Field(default=None, max_length=253, description="PriorityClass of the pod.")
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        default=None, max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="Secrets (kubernetes.io/dockerconfigjson) to pull the image "
                                                 "with (merged by name).")
    labels: _LabelMap | None = Field(
        default=None, max_length=64, json_schema_extra={"x-kubernetes-validations": [_LABELS_RULE]},
        description=f"Labels of the pod (merged key by key). Not {RESERVED_PREFIX}* nor "
                    + ", ".join(RESERVED_LABELS) + ": the operator and Spark select their pods by them.")
    annotations: _AnnotationMap | None = Field(
        default=None, max_length=64,
        json_schema_extra={"x-kubernetes-validations": [_ANNOTATIONS_RULE]},
        description=f"Annotations of the pod (merged key by key); not {RESERVED_PREFIX}* (the config hash).")
    env: list[EnvVar] | None = Field(default=None, max_length=128,
                                     json_schema_extra={"x-kubernetes-list-type": "map",
                                                        "x-kubernetes-list-map-keys": ["name"]},
                                     description="Environment of the Spark container (merged by name; HANDOFF_* "
                                                 "switches of docs/switches.md welcome). Not the names the "
                                                 "operator sets on the driver (POD_NAME, POD_NAMESPACE, POD_IP, "
                                                 "PYSPARK_SUBMIT_ARGS, HANDOFF_SPARK_MASTER, "
                                                 "HANDOFF_STOP_GRACE_SECONDS, HANDOFF_DRIVER_POD_NAME, "
                                                 "HANDOFF_PROGRESS_*) nor SPARK_* on executors (Spark's).")
    env_from: list[EnvFromSource] | None = Field(default=None, max_length=16,
                                                 description="Every key of these Secrets or ConfigMaps as "
                                                             "environment (replaced whole by a role).")
    volumes: list[Volume] | None = Field(default=None, max_length=32,
                                         json_schema_extra={"x-kubernetes-list-type": "map",
                                                            "x-kubernetes-list-map-keys": ["name"]},
                                         description="Volumes (secret, configMap, emptyDir; merged by name). Not "
                                                     "the operator's (app-config, run, checkpoint, "
                                                     "bigquery-credentials) nor spark-*.")
    volume_mounts: list[VolumeMount] | None = Field(
        default=None, max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["mountPath"]},
        description="Mounts of those volumes into the Spark container (merged by "
                                                 "mountPath). Not under /etc/handoff, /var/run/handoff, "
                                                 "/var/lib/handoff nor /opt/spark/conf.")
    pod_security_context: PodSecurityContext | None = Field(default=None, description="The pod's "
                                                                                      "securityContext (merged "
                                                                                      "field by field).")
    container_security_context: ContainerSecurityContext | None = Field(
        default=None, description="The Spark container's securityContext (merged field by field).")

    @field_validator("labels", "annotations", "node_selector")
    @classmethod
    def _keys_are_label_keys(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        # The key grammar is checked here only: a key pattern would make the CRD's schema non-structural
        # (patternProperties); the API server refuses a bad key when the pod is created anyway.
        bad = sorted(k for k in value or {} if not re.fullmatch(_LABEL_KEY, k))
        if bad:
            raise ValueError(f"{', '.join(map(repr, bad))}: not a Kubernetes label key ([prefix/]name: a DNS "
                             f"subdomain prefix, a name of letters, digits, '-', '_', '.')")
        return value

    @field_validator("labels")
    @classmethod
    def _labels_not_reserved(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        bad = refused_label_keys(value or {})
        if bad:
            raise ValueError(f"{', '.join(bad)}: the operator and Spark select their pods by these labels; use "
                             f"other keys")
        return value

    @field_validator("annotations")
    @classmethod
    def _annotations_not_reserved(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        bad = refused_annotation_keys(value or {})
        if bad:
            raise ValueError(f"{', '.join(bad)}: the operator's own annotations (the config hash); use other keys")
        return value

    def overlaid(self, role: "PodOptions") -> "PodOptions":
        """This shared block with `role` laid over it (the role wins), as the field descriptions say."""
        merged: dict[str, Any] = {}
        for name in type(self).model_fields:
            shared, own = getattr(self, name), getattr(role, name)
            if own is None:
                merged[name] = shared
            elif shared is None:
                merged[name] = own
            elif name in MAP_FIELDS:
                merged[name] = {**shared, **own}
            elif name in KEYED_LISTS:
                key = KEYED_LISTS[name]
                by_key = {getattr(item, key): item for item in shared}
                by_key.update({getattr(item, key): item for item in own})
                merged[name] = list(by_key.values())
            elif name in MERGED_OBJECTS:
                fields = type(shared).model_fields
                merged[name] = type(shared).model_construct(**{
                    f: getattr(own, f) if getattr(own, f) is not None else getattr(shared, f) for f in fields})
            else:
                merged[name] = own
        return PodOptions.model_construct(**merged)

    def is_empty(self) -> bool:
        return all(getattr(self, name) is None for name in type(self).model_fields)

    def wire(self, field: str) -> Any:
        """One field as Kubernetes spells it (camelCase, unset parts left out), None when unset."""
        value = getattr(self, field)
        if value is None:
            return None
        if isinstance(value, list):
            return [v.to_dict() if isinstance(v, SpecModel) else v for v in value]
        if isinstance(value, SpecModel):
            return value.to_dict()
        return dict(value) if isinstance(value, dict) else value
