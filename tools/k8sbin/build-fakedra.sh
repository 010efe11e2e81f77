#!/usr/bin/env bash
# Builds tmi-fakedra (fakedra/: the simulated GPUs' DRA kubelet plugin, on
# k8s.io/dynamic-resource-allocation's kubeletplugin) from the Go module proxy into a cache
# directory keyed by its sources, beside the node binaries. Kept apart from build-node.sh so a
# change to the plugin rebuilds the plugin alone, not the kubelet and containerd. No-op when
# present.
#
#   tools/k8sbin/build-fakedra.sh     # build (or reuse) and print the directory
#   TMI_FAKEDRA_BIN_DIR=/some/dir tools/k8sbin/build-fakedra.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=lib.sh
source "$here/lib.sh"

hash="$(cat "$here"/fakedra/go.mod "$here"/fakedra/go.sum "$here"/fakedra/*.go | sha256sum | cut -c1-12)"
bin_dir="${TMI_FAKEDRA_BIN_DIR:-$HOME/.cache/tmi/fakedra/$hash}"
binaries=(tmi-fakedra)

if all_present; then
  echo "tmi-fakedra already present: $bin_dir" >&2
  echo "$bin_dir"
  exit 0
fi

use_go
check_pin "$here/fakedra" k8s.io/dynamic-resource-allocation "v0${K8S_VERSION#v1}"
mkdir -p "$(dirname "$bin_dir")"
tmp="$(mktemp -d "${bin_dir}.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
build_begin fakedra tmi-fakedra
step_begin tmi-fakedra "tmi-fakedra"
CGO_ENABLED=0 go -C "$here/fakedra" build -trimpath -ldflags "-s -w" -o "$tmp/tmi-fakedra" .
step_end
if all_present; then
  echo "another build finished first; keeping $bin_dir" >&2
else
  rm -rf "$bin_dir"
  mv "$tmp" "$bin_dir"
  trap - EXIT
fi
build_end
echo "$bin_dir"
