{{/*
Names and the operator's RBAC rules, shared by the cluster-wide and the namespaced mode so that both grant exactly
the same rights on namespaced resources.
*/}}

{{/* The operator's ServiceAccount, Deployment and RBAC objects: <release>-operator unless overridden. */}}
{{- define "kanri.fullname" -}}
{{- default (printf "%s-operator" .Release.Name) .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The pods' label, fixed so that NetworkPolicies and dashboards can select the operator whatever the release. */}}
{{- define "kanri.selectorLabels" -}}
app.kubernetes.io/name: kanri-operator
{{- end -}}

{{/* Namespaced mode: the one watched namespace, or "" for cluster-wide. */}}
{{- define "kanri.watchNamespace" -}}
{{- $namespaces := .Values.watchNamespaces | default list -}}
{{- if gt (len $namespaces) 1 -}}
{{- fail "watchNamespaces: the operator watches one namespace or all of them (kanri run --namespace); list at most one" -}}
{{- end -}}
{{- if $namespaces -}}{{ first $namespaces }}{{- end -}}
{{- end -}}

{{/*
Rules on namespaced resources: a ClusterRole's in cluster-wide mode, a Role's in each watched namespace otherwise.
Everything the reconciler reads, writes or owns, and nothing else (no exec, no nodes, no escalation verbs).
*/}}
{{- define "kanri.namespacedRules" -}}
- apiGroups: ["kanri.dev"]
  resources: ["postgresclusters"]
  verbs: ["get", "list", "watch", "update", "patch"]
- apiGroups: ["kanri.dev"]
  resources: ["postgresclusters/status", "postgresclusters/finalizers"]
  verbs: ["get", "update", "patch"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps", "secrets", "persistentvolumeclaims", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# The instances' Role grants `get` on their own ConfigMap and Secrets: RBAC lets the operator grant only what
# it holds itself, which the rules above cover.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/* Rules on cluster-scoped resources, which no Role can grant: read-only, in both modes. */}}
{{- define "kanri.clusterRules" -}}
# StorageClasses: does a claim's class exist, and does it allow volume expansion?
- apiGroups: ["storage.k8s.io"]
  resources: ["storageclasses"]
  verbs: ["get", "list", "watch"]
{{- end -}}
