#!/usr/bin/env bash
# Pins k8s.io/kubernetes at the version given and rewrites go.mod's replace block from kubernetes' own go.mod.
#
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and replaces them
# with ./staging/src paths that do not exist outside its repository. The published twin of v1.X.Y is v0.X.Y, so every
# module in its replace block is pointed at that release. The list is read from the module's go.mod, never copied.
#
# usage: hack/pin-kubernetes.sh v1.37.2
set -euo pipefail
cd "$(dirname "$0")/.."

k8s_version="${1:?usage: $0 v1.MINOR.PATCH}"
staging_version="v0${k8s_version#v1}"

gomod=$(go mod download -json "k8s.io/kubernetes@${k8s_version}" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
[ -f "$gomod" ] || { echo "could not download k8s.io/kubernetes@${k8s_version}" >&2; exit 1; }

# Every "k8s.io/NAME => ./staging/src/k8s.io/NAME" line of kubernetes' replace block.
mapfile -t staging < <(sed -n 's|^\s*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/src/.*$|\1|p' "$gomod")
[ "${#staging[@]}" -gt 0 ] || { echo "no staging replaces found in $gomod" >&2; exit 1; }

args=()
for module in "${staging[@]}"; do
  args+=("-replace=${module}=${module}@${staging_version}")
done
go mod edit "${args[@]}"
go mod edit -require="k8s.io/kubernetes@${k8s_version}"
go mod tidy
echo "pinned k8s.io/kubernetes ${k8s_version}; ${#staging[@]} staging modules replaced with ${staging_version}"
