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

{{/* The watched namespaces (namespaced mode), checked; an empty list is cluster-wide mode. */}}
{{- define "kanri.watchNamespaces" -}}
{{- $namespaces := .Values.watchNamespaces | default list -}}
{{- if ne (len $namespaces) (len (uniq $namespaces)) -}}
{{- fail "watchNamespaces: a namespace is listed twice" -}}
{{- end -}}
{{- range $namespaces -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" .) -}}
{{- fail (printf "watchNamespaces: %q is not a namespace name" .) -}}
{{- end -}}
{{- end -}}
{{- join "," $namespaces -}}
{{- end -}}

{{/* The default backup repository as the operator's YAML file, checked; "" when none is set. */}}
{{- define "kanri.defaultRepository" -}}
{{- $repository := .Values.backup.defaultRepository | default dict -}}
{{- if not (kindIs "map" $repository) -}}
{{- fail "backup.defaultRepository: give the fields of backup.repository.s3 (endpoint, bucket, credentialsSecret, ...), not a URL" -}}
{{- end -}}
{{- if $repository -}}
{{- range $field := list "endpoint" "bucket" -}}
{{- if not (get $repository $field) -}}
{{- fail (printf "backup.defaultRepository.%s is required" $field) -}}
{{- end -}}
{{- end -}}
{{- if not (get ($repository.credentialsSecret | default dict) "name") -}}
{{- fail "backup.defaultRepository.credentialsSecret.name is required (a Secret in the release namespace)" -}}
{{- end -}}
{{- toYaml $repository -}}
{{- end -}}
{{- end -}}

{{/*
Rules on namespaced resources: a ClusterRole's in cluster-wide mode, a Role's in each watched namespace otherwise.
Exactly what the operator's code uses (kanri.postgres.operator.permissions(), checked by
tests/unit/test_operator_permissions.py): list + watch on what it watches, and only the writes it sends. Server-side
apply creates a missing object, hence create + patch on applied kinds; nothing is ever replaced (no update), and
there is no exec, no RBAC object, no node and no namespace among them.
*/}}
{{- define "kanri.namespacedRules" -}}
- apiGroups: ["kanri.dev"]
  resources: ["postgresclusters"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["kanri.dev"]
  resources: ["postgresclusters/status"]
  verbs: ["patch"]
# blockOwnerDeletion on the children's owner references, where OwnerReferencesPermissionEnforcement is enabled.
- apiGroups: ["kanri.dev"]
  resources: ["postgresclusters/finalizers"]
  verbs: ["update"]
# the first and the scheduled base backups are created by the operator; retention deletes the expired ones
- apiGroups: ["kanri.dev"]
  resources: ["postgresbackups"]
  verbs: ["list", "watch", "create", "delete"]
- apiGroups: ["kanri.dev"]
  resources: ["postgresbackups/status"]
  verbs: ["patch"]
# PostgresPoolers (docs/pooler.md): read, their status written; PgBouncer's Deployment applied
- apiGroups: ["kanri.dev"]
  resources: ["postgrespoolers"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["kanri.dev"]
  resources: ["postgrespoolers/status"]
  verbs: ["patch"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# update: a renewed TLS certificate replaces the managed Secret as a whole (tls_step.py); get: the platform's default
# backup repository key pair, read from the operator's namespace (backup.py)
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps", "serviceaccounts"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# -rw's EndpointSlices: Ready waits until -rw routes to the primary
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list"]
{{- end -}}

{{/* Rules on cluster-scoped resources, which no Role can grant: read-only, in both modes. */}}
{{- define "kanri.clusterRules" -}}
# StorageClasses: does a claim's class exist, and does it allow volume expansion?
- apiGroups: ["storage.k8s.io"]
  resources: ["storageclasses"]
  verbs: ["list", "watch"]
# Nodes, one by name: is the primary's node cordoned? Then a planned switchover before the drain (never list, never
# a write, never nodes/proxy).
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get"]
{{- if .Values.upgradeCRDs }}
# Its own three CRDs, by name: replaced with the operator's at start (values `upgradeCRDs`; crds/ creates them).
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  resourceNames: ["postgresclusters.kanri.dev", "postgresbackups.kanri.dev", "postgrespoolers.kanri.dev"]
  verbs: ["get", "update"]
{{- end }}
{{- end -}}

{{/*
An image reference: <registry>/<repository>:<tag>@<digest>. The digest is the one given, else the packaged chart's
digests.yaml entry for repository:tag (written by `make images`), else none (the tag alone). Called with a dict:
registry, repository, tag, digest, root (the chart's top-level context).
*/}}
{{- define "kanri.image" -}}
{{- $digests := .root.Files.Get "digests.yaml" | fromYaml | default dict -}}
{{- $digest := .digest | default (get $digests (printf "%s:%s" .repository .tag)) -}}
{{- if and $digest (not (regexMatch "^sha256:[a-f0-9]{64}$" $digest)) -}}
{{- fail (printf "the digest of %s:%s is not sha256:<64 hex digits>: %q" .repository .tag $digest) -}}
{{- end -}}
{{- $name := .repository -}}
{{- if .registry -}}{{- $name = printf "%s/%s" (trimSuffix "/" .registry) .repository -}}{{- end -}}
{{- if $digest -}}{{- printf "%s:%s@%s" $name .tag $digest -}}{{- else -}}{{- printf "%s:%s" $name .tag -}}{{- end -}}
{{- end -}}

{{/* The operator's image. */}}
{{- define "kanri.operatorImage" -}}
{{- include "kanri.image" (dict "root" . "registry" .Values.image.registry "repository" .Values.image.repository "tag" (.Values.image.tag | default .Chart.AppVersion | toString) "digest" .Values.image.digest) -}}
{{- end -}}

{{/* KANRI_POSTGRES_IMAGES: {"postgres": {major: ref}, "upgrade": {major: ref}} (kanri.postgres.children.images). An
upgrade image exists for every major but the lowest (nothing upgrades to it). */}}
{{- define "kanri.postgresImages" -}}
{{- $root := . -}}
{{- $pg := .Values.postgres -}}
{{- $registry := $pg.registry | default .Values.image.registry -}}
{{- $instance := dict -}}
{{- $upgrade := dict -}}
{{- $majors := $pg.majors | default list -}}
{{- range $i, $major := $majors -}}
{{- $key := toString $major -}}
{{- $_ := set $instance $key (include "kanri.image" (dict "root" $root "registry" $registry "repository" $pg.repository "tag" $key "digest" (get ($pg.digests | default dict) $key))) -}}
{{- if gt $i 0 -}}
{{- $_ := set $upgrade $key (include "kanri.image" (dict "root" $root "registry" $registry "repository" $pg.upgradeRepository "tag" $key "digest" (get ($pg.upgradeDigests | default dict) $key))) -}}
{{- end -}}
{{- end -}}
{{- dict "postgres" $instance "upgrade" $upgrade | toJson -}}
{{- end -}}

{{/* A workload image table, {version: ref} (kanri.kit.image_for; KANRI_KAFKA_IMAGES, KANRI_VALKEY_IMAGES): one
reference per listed version, <registry>/<repository>:<version>@<digest> (the digest given per version, else the
packaged chart's). Called with a dict: root, registry (empty: image.registry), repository, versions, digests. */}}
{{- define "kanri.versionImages" -}}
{{- $root := .root -}}
{{- $registry := .registry | default $root.Values.image.registry -}}
{{- $repository := .repository -}}
{{- $digests := .digests | default dict -}}
{{- $table := dict -}}
{{- range $version := .versions | default list -}}
{{- $key := toString $version -}}
{{- $_ := set $table $key (include "kanri.image" (dict "root" $root "registry" $registry "repository" $repository "tag" $key "digest" (get $digests $key))) -}}
{{- end -}}
{{- $table | toJson -}}
{{- end -}}
