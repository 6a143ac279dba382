{{/*
The Cache (Valkey) operator's names and RBAC rules (values `cache`; docs/cache.md, "Installing"). Everything under
templates/cache/ renders only with cache.enabled.
*/}}

{{/* Its ServiceAccount, Deployment and RBAC objects: <release>-cache-operator unless overridden. */}}
{{- define "kanri.cache.fullname" -}}
{{- default (printf "%s-cache-operator" .Release.Name) .Values.cache.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Its pods' label, fixed (as the PostgreSQL operator's) and distinct from it: each operator's Service and
NetworkPolicy select its own pods only. */}}
{{- define "kanri.cache.selectorLabels" -}}
app.kubernetes.io/name: kanri-cache-operator
{{- end -}}

{{/*
Exactly what the operator's code uses, in every namespace (kanri.cache.permissions.permissions(), checked by
tests/unit/test_cache_chart.py): list + watch on what it watches, and only the writes it sends. Server-side apply
creates a missing object, hence create + patch on applied kinds; nothing is replaced (no update), no exec, no node,
no namespace. The ServiceAccount, Role and RoleBinding are the per-Cache identity of the in-pod agents (each agent
labels its own pod); an operator may only put in a Role what it holds itself, hence get + patch on pods.
*/}}
{{- define "kanri.cache.rules" -}}
- apiGroups: ["kanri.dev"]
  resources: ["caches"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["kanri.dev"]
  resources: ["caches/status"]
  verbs: ["patch"]
# blockOwnerDeletion on the children's owner references, where OwnerReferencesPermissionEnforcement is enabled.
- apiGroups: ["kanri.dev"]
  resources: ["caches/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["list", "watch", "create", "patch"]
# the password Secret: created once; at the Cache's deletion released or deleted (deletionPolicy)
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# the volumes the StatefulSet creates: released or deleted (deletionPolicy)
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "watch", "patch", "delete"]
# role labels that steer -rw and -ro; a rolling replace deletes the pod it replaces
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# the agents' identity, one per Cache (owned by it: garbage-collected with it)
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["list", "watch", "create", "patch"]
{{- end -}}
