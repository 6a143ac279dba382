#!/usr/bin/env bash
# Builds the parts of a real Kubernetes node from their Go modules at pinned versions into OUT (default
# .build/node/bin): the kubelet and kube-proxy (k8s.io/kubernetes, through this module's go.mod, pinned like the
# control plane's), containerd with its runc shim and ctr, runc (cgo + libseccomp), the CNI plugins and crictl.
#
# Each binary is rebuilt only when it is missing or its pin changed: the pin is stamped next to it (NAME.version).
# The wall time of every build that ran is appended to OUT/build-times.log (docs/real-nodes.md quotes it).
#
# usage: nodes/build.sh [OUT]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(realpath -m "${1:-$here/../.build/node/bin}")"
mkdir -p "$out"

KUBERNETES_VERSION=v1.37.2
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.3
CNI_PLUGINS_VERSION=v1.10.0
CRI_TOOLS_VERSION=v1.37.0
# cluster add-ons run on real nodes (src/kanri/local/realnode/addons)
COREDNS_VERSION=v1.15.0
KUBE_NETWORK_POLICIES_VERSION=v0.8.0
LOCAL_PATH_PROVISIONER_VERSION=v0.0.30

export GOFLAGS=-buildvcs=false

# A binary built before on this machine (by another clone) is copied, not relinked: hack/bincache.sh. Its key
# includes this module's go.mod/go.sum and this script, which decide what a pin builds.
# shellcheck source=../hack/bincache.sh
. "$here/../hack/bincache.sh"
BINCACHE_INPUTS="$(cat "$here/go.mod" "$here/go.sum" "$0" | sha256sum | cut -c1-24)"

# build NAME PIN COMMAND...: runs COMMAND (which writes $out/NAME) unless NAME is stamped with PIN.
build() {
  local name="$1" pin="$2"
  shift 2
  if [ -x "$out/$name" ] && [ "$(cat "$out/$name.version" 2>/dev/null)" = "$pin" ]; then
    return 0
  fi
  rm -f "$out/$name.version"
  if bincache_fetch "$name" "$pin" "$out/$name"; then
    echo "$pin" >"$out/$name.version"
    return 0
  fi
  echo "building $name $pin (a cold build takes minutes)"
  local started=$SECONDS
  "$@"
  echo "$pin" >"$out/$name.version"
  bincache_store "$name" "$pin" "$out/$name"
  echo "$(date -u +%FT%TZ) $name $pin $((SECONDS - started))s" >>"$out/build-times.log"
}

# The kubelet and kube-proxy: this module requires k8s.io/kubernetes at the pinned version (its staging modules
# replaced with their published twins, as controlplane/hack/pin-kubernetes.sh does) and names both as tools.
# CGO-free like the control plane, so they share its warm build cache. The version is stamped the way Kubernetes'
# own build does it (hack/lib/version.sh), so the node reports kubeletVersion v1.37.2.
k8s_ldflags() {
  local minor="${KUBERNETES_VERSION#v1.}"
  minor="${minor%%.*}"
  local pkg=k8s.io/component-base/version
  echo "-X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor" \
    "-X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
}
kube_tool() {
  local name="$1"
  (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "$(k8s_ldflags)" -o "$out/$name" \
    "k8s.io/kubernetes/cmd/$name")
}
build kubelet "$KUBERNETES_VERSION" kube_tool kubelet
build kube-proxy "$KUBERNETES_VERSION" kube_tool kube-proxy

# go_install NAME MODULE/PATH@VERSION [LDFLAGS]: CGO-free `go install` into $out.
go_install() {
  CGO_ENABLED=0 GOBIN="$out" go install -trimpath -ldflags "${3:-}" "$2"
}

# containerd, its runc shim and ctr. CGO-free: the btrfs snapshotter (cgo) is left out; overlayfs is what a node
# uses. The version is stamped like containerd's Makefile does; the CRI reports it as the runtime version.
containerd_ldflags="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
for cmd in containerd containerd-shim-runc-v2 ctr; do
  build "$cmd" "$CONTAINERD_VERSION" go_install "$cmd" \
    "github.com/containerd/containerd/v2/cmd/$cmd@$CONTAINERD_VERSION" "$containerd_ldflags"
done

# runc needs cgo and libseccomp (Debian's libseccomp-dev) for seccomp profiles such as RuntimeDefault.
runc_install() {
  CGO_ENABLED=1 GOBIN="$out" go install -trimpath -tags seccomp \
    -ldflags "-X main.version=${RUNC_VERSION#v}" "github.com/opencontainers/runc@$RUNC_VERSION"
}
build runc "$RUNC_VERSION" runc_install

# The CNI plugins a node's pod network uses, installed into $out/cni (the kubelet's and containerd's bin dir).
cni_install() {
  mkdir -p "$out/cni"
  CGO_ENABLED=0 GOBIN="$out/cni" go install -trimpath \
    -ldflags "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION" \
    "github.com/containernetworking/plugins/plugins/$1@$CNI_PLUGINS_VERSION"
}
for plugin in main/bridge ipam/host-local main/loopback meta/portmap; do
  name="${plugin#*/}"
  build "cni/$name" "$CNI_PLUGINS_VERSION" cni_install "$plugin"
done

build crictl "$CRI_TOOLS_VERSION" go_install crictl "sigs.k8s.io/cri-tools/cmd/crictl@$CRI_TOOLS_VERSION" \
  "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRI_TOOLS_VERSION"

# Cluster add-ons (src/kanri/local/realnode/addons, docs/real-nodes.md "Add-ons"). CoreDNS, CGO-free: a static binary
# the add-ons put alone into an image of their own; its version is stamped the way its Makefile does.
build coredns "$COREDNS_VERSION" go_install coredns "github.com/coredns/coredns@$COREDNS_VERSION" \
  "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION"

# kube-network-policies (NetworkPolicy by nfqueue): its main package is the module's cmd/, which `go install` would
# name `cmd`, so it is installed into a scratch GOBIN and renamed.
network_policies_install() {
  local scratch
  scratch="$(mktemp -d)"
  CGO_ENABLED=0 GOBIN="$scratch" go install -trimpath \
    "sigs.k8s.io/kube-network-policies/cmd@$KUBE_NETWORK_POLICIES_VERSION"
  mv "$scratch/cmd" "$out/kube-network-policies"
  rmdir "$scratch"
}
build kube-network-policies "$KUBE_NETWORK_POLICIES_VERSION" network_policies_install

# rancher's local-path-provisioner (node-local volumes); its version is stamped the way its Makefile does.
build local-path-provisioner "$LOCAL_PATH_PROVISIONER_VERSION" go_install local-path-provisioner \
  "github.com/rancher/local-path-provisioner@$LOCAL_PATH_PROVISIONER_VERSION" \
  "-s -w -X main.VERSION=$LOCAL_PATH_PROVISIONER_VERSION"
