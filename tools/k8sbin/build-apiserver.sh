#!/usr/bin/env bash
# Builds kube-apiserver of one Kubernetes release from the Go module proxy into
# ~/.cache/tmi/apiserver/<version>/ (or $TMI_APISERVER_BIN_DIR/<version>/), for the version
# range the chart is checked against (`make test-versions`). The module is made on the fly:
# k8s.io/kubernetes's staging modules are pointed at their published v0.<minor>.<patch> tags,
# as update.sh does for the pinned release. No-op when the binary is there.
#
#   tools/k8sbin/build-apiserver.sh v1.37.2     # prints the binary's path
set -euo pipefail

version="${1:?usage: build-apiserver.sh vX.Y.Z}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"
out="${TMI_APISERVER_BIN_DIR:-$HOME/.cache/tmi/apiserver}/$version"
if [[ -x "$out/kube-apiserver" ]]; then
  echo "$out/kube-apiserver"
  exit 0
fi
use_go
export GOFLAGS=-mod=mod
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
staging_version="v0.${version#v1.}"
gomod="$(go mod download -json "k8s.io/kubernetes@${version}" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
mapfile -t staging < <(sed -n 's|^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/src/.*|\1|p' "$gomod")
(cd "$work" && go mod init tmi.local/apiserver >/dev/null 2>&1 && go mod edit -go=1.26.0)
for m in "${staging[@]}"; do
  go -C "$work" mod edit -replace="$m=$m@${staging_version}"
done
go -C "$work" get -tool "k8s.io/kubernetes/cmd/kube-apiserver@${version}" >&2
minor="$(echo "$version" | cut -d. -f2)"
mkdir -p "$out"
echo ">> building kube-apiserver ${version}" >&2
CGO_ENABLED=0 go -C "$work" build -trimpath \
  -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=${version} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}" \
  -o "$out/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
echo "$out/kube-apiserver"
