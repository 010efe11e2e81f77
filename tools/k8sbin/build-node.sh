#!/usr/bin/env bash
# Builds what the local cluster's real node runs, from the Go module proxy, into a versioned
# cache directory beside the control-plane binaries: kubelet and kube-proxy (K8S_VERSION),
# containerd with its runc shim and ctr, runc (cgo, with seccomp), the CNI plugins bridge,
# host-local, loopback and portmap, and the project's node tools (nodetools/: tmi-fakegpu, the
# simulated GPUs' device plugin, and tmi-probe, the engine stand-in and pause process). No-op
# when all of them are present. runc links libseccomp; its headers come from Debian's
# libseccomp-dev, and kube-proxy needs iptables: both are installed here when missing (the real
# node runs as root anyway).
#
#   tools/k8sbin/build-node.sh       # build (or reuse) and print the directory
#   TMI_NODE_BIN_DIR=/some/dir tools/k8sbin/build-node.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=lib.sh
source "$here/lib.sh"

# The node tools are the project's own code: their sources are part of the key.
tools_hash="$(cat "$here"/nodetools/go.mod "$here"/nodetools/go.sum "$here"/nodetools/*/*.go | sha256sum | cut -c1-12)"
key="${K8S_VERSION}-containerd${CONTAINERD_VERSION#v}-runc${RUNC_VERSION#v}-cni${CNI_PLUGINS_VERSION#v}-tools${tools_hash}"
bin_dir="${TMI_NODE_BIN_DIR:-$HOME/.cache/tmi/nodebin/$key}"
binaries=(kubelet kube-proxy containerd containerd-shim-runc-v2 ctr runc bridge host-local loopback portmap tmi-fakegpu tmi-probe)

# What the node needs from the machine itself: kube-proxy programs Services with iptables.
if ! command -v iptables-restore >/dev/null; then
  echo ">> installing iptables (kube-proxy's Service rules)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q iptables >&2
fi

if all_present; then
  echo "node binaries already present (${key}): $bin_dir" >&2
  echo "$bin_dir"
  exit 0
fi

use_go

check_pin "$here" k8s.io/kubernetes "$K8S_VERSION"
check_pin "$here/containerd" github.com/containerd/containerd/v2 "$CONTAINERD_VERSION"
check_pin "$here/runc" github.com/opencontainers/runc "$RUNC_VERSION"
check_pin "$here/cni" github.com/containernetworking/plugins "$CNI_PLUGINS_VERSION"

if [[ ! -e /usr/include/seccomp.h ]]; then
  echo ">> installing libseccomp-dev (runc's seccomp support)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q libseccomp-dev pkg-config >&2
fi

mkdir -p "$(dirname "$bin_dir")"
tmp="$(mktemp -d "${bin_dir}.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"

build_begin node kubelet containerd runc cni nodetools
k8s_minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
k8s_ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=${k8s_minor} \
 -X k8s.io/component-base/version.gitTreeState=clean"

step_begin kubelet "kubelet, kube-proxy ${K8S_VERSION}"
CGO_ENABLED=0 go -C "$here" build -trimpath -ldflags "$k8s_ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
step_end

step_begin containerd "containerd ${CONTAINERD_VERSION}"
CGO_ENABLED=0 go -C "$here/containerd" build -trimpath \
  -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION}" \
  -o "$tmp/" github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr
step_end

step_begin runc "runc ${RUNC_VERSION}"
# runc's nsenter is C, so cgo is required; the seccomp tag makes RuntimeDefault profiles work.
CGO_ENABLED=1 go -C "$here/runc" build -trimpath -tags seccomp \
  -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" -o "$tmp/runc" github.com/opencontainers/runc
step_end

step_begin cni "CNI plugins ${CNI_PLUGINS_VERSION}"
CGO_ENABLED=0 go -C "$here/cni" build -trimpath -ldflags "-s -w" -o "$tmp/" \
  github.com/containernetworking/plugins/plugins/main/bridge \
  github.com/containernetworking/plugins/plugins/ipam/host-local \
  github.com/containernetworking/plugins/plugins/main/loopback \
  github.com/containernetworking/plugins/plugins/meta/portmap
step_end

step_begin nodetools "tmi-fakegpu, tmi-probe"
CGO_ENABLED=0 go -C "$here/nodetools" build -trimpath -ldflags "-s -w" -o "$tmp/tmi-fakegpu" ./fakegpu
CGO_ENABLED=0 go -C "$here/nodetools" build -trimpath -ldflags "-s -w" -o "$tmp/tmi-probe" ./probe
step_end

printf 'K8S_VERSION=%s\nCONTAINERD_VERSION=%s\nRUNC_VERSION=%s\nCNI_PLUGINS_VERSION=%s\nGO=%s\n' \
  "$K8S_VERSION" "$CONTAINERD_VERSION" "$RUNC_VERSION" "$CNI_PLUGINS_VERSION" \
  "$(go env GOVERSION)" > "$tmp/VERSIONS"

if all_present; then
  echo "another build finished first; keeping $bin_dir" >&2
else
  rm -rf "$bin_dir"
  mv "$tmp" "$bin_dir"
  trap - EXIT
fi
build_end
echo "$bin_dir"
