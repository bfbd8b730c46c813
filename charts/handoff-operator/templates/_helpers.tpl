{{/* Names and labels shared by the templates. */}}

{{- define "handoff.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "handoff.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "handoff.selectorLabels" -}}
app.kubernetes.io/name: {{ include "handoff.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "handoff.labels" -}}
{{ include "handoff.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: handoff
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "handoff.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "handoff.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "handoff.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
Rules the operator needs in every namespace it manages. It creates each handoff's children
(ConfigMap/Secret with the app config, driver Deployment + headless Service, checkpoint PVC) and, unless
the handoff names its own service account, a ServiceAccount + Role + RoleBinding for the driver. A
Role can only grant what its creator holds (RBAC escalation check), so the operator holds the driver's
rights on pods/services/configmaps/PVCs itself.
*/}}
{{- define "handoff.namespacedRules" -}}
- apiGroups: [handoff.io]
  resources: [streamtablehandoffs, replayrequests]
  verbs: [get, list, watch, patch, update]
- apiGroups: [handoff.io]
  resources: [streamtablehandoffs/status, replayrequests/status]
  verbs: [get, patch, update]
# Children carry ownerReferences with blockOwnerDeletion.
- apiGroups: [handoff.io]
  resources: [streamtablehandoffs/finalizers, replayrequests/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [pods, services, configmaps, persistentvolumeclaims]
  verbs: [get, list, watch, create, update, patch, delete, deletecollection]
# Secrets: read the ones propertiesFrom/credentialsFrom name, write the resolved app config.
- apiGroups: [""]
  resources: [secrets, serviceaccounts]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, update, patch, delete]
# The Spark UI's Ingress (spec.spark.ui.ingress): applied, and deleted when the spec drops it.
- apiGroups: [networking.k8s.io]
  resources: [ingresses]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [get, patch, update]
# Backfill ReplayRequests run as Jobs (owned by the request: deleting it deletes the Job).
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{/* What spec.retention.mode=enforce needs when Strimzi manages a topic: find the KafkaTopic naming it
(list), read it, raise spec.config.retention.ms (patch). Nothing else: no create/delete/update. */}}
{{- define "handoff.kafkaTopicRules" -}}
- apiGroups: [kafka.strimzi.io]
  resources: [kafkatopics]
  verbs: [get, list, patch]
{{- end -}}
