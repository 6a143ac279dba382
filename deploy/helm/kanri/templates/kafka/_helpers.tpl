{{/*
The Kafka operator's names and RBAC rules (values `kafka`; docs/kafka.md, "Installing"). Everything under
templates/kafka/ renders only with kafka.enabled.
*/}}

{{/* Its ServiceAccount, Deployment and RBAC objects: <release>-kafka-operator unless overridden. */}}
{{- define "kanri.kafka.fullname" -}}
{{- default (printf "%s-kafka-operator" .Release.Name) .Values.kafka.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Its pods' label, fixed and distinct from the other operators': each operator selects its own pods only. */}}
{{- define "kanri.kafka.selectorLabels" -}}
app.kubernetes.io/name: kanri-kafka-operator
{{- end -}}

{{/*
Exactly what the operator's code uses (kanri.kafka.permissions.permissions(), checked by
tests/unit/test_kafka_chart.py): list + watch on what its two controllers watch, and only the writes they send.
Server-side apply creates a missing object, hence create + patch on applied kinds; nothing is replaced (no update),
no exec, no node, no namespace. Secrets only for TLS (the cluster's CA and the brokers' certificate). The brokers
themselves are reached over the Kafka protocol.
*/}}
{{- define "kanri.kafka.rules" -}}
- apiGroups: ["kanri.dev"]
  resources: ["kafkaclusters", "kafkatopics"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["kanri.dev"]
  resources: ["kafkaclusters/status", "kafkatopics/status"]
  verbs: ["patch"]
# blockOwnerDeletion on the cluster's children's owner references, where OwnerReferencesPermissionEnforcement is on
- apiGroups: ["kanri.dev"]
  resources: ["kafkaclusters/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "patch"]
# the brokers' config and the KRaft cluster id (kept or deleted with the volumes, deletionPolicy)
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# TLS (spec.tls.enabled): the cluster's CA (created once, read back) and the brokers' certificate
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# the brokers' volumes: released or deleted at the cluster's deletion (deletionPolicy)
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "watch", "patch", "delete"]
# a rolling restart deletes one broker's pod at a time
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}
