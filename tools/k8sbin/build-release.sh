#!/usr/bin/env bash
# Builds kube-apiserver and kube-scheduler of one Kubernetes release from the Go module proxy
# into ~/.cache/tmi/release/<version>/ (or $TMI_RELEASE_BIN_DIR/<version>/), for the version
# range the chart is checked against (`make test-versions`): the chart's objects go to that
# release's API server and its engine Pods through that release's scheduler, which the chart's
# scheduler image follows. The module is made on the fly: k8s.io/kubernetes's staging modules
# are pointed at their published v0.<minor>.<patch> tags, as update.sh does for the pinned
# release. Builds only what is missing; prints the directory, and exits 1 if a binary could
# not be built.
#
#   tools/k8sbin/build-release.sh v1.37.2
set -euo pipefail

version="${1:?usage: build-release.sh vX.Y.Z}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"
out="${TMI_RELEASE_BIN_DIR:-$HOME/.cache/tmi/release}/$version"
missing=()
for b in kube-apiserver kube-scheduler; do
  [[ -x "$out/$b" ]] || missing+=("$b")
done
if ((${#missing[@]} == 0)); then
  echo "$out"
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
(cd "$work" && go mod init tmi.local/release >/dev/null 2>&1 && go mod edit -go=1.26.0)
for m in "${staging[@]}"; do
  go -C "$work" mod edit -replace="$m=$m@${staging_version}"
done
minor="$(echo "$version" | cut -d. -f2)"
mkdir -p "$out"
# Each binary on its own: the proxy may lack a staging module one of them needs (it serves no
# k8s.io/kube-scheduler v0.31.14), which fails that binary only; the exit status says so.
failed=0
for b in "${missing[@]}"; do
  echo ">> building $b ${version}" >&2
  if ! go -C "$work" get -tool "k8s.io/kubernetes/cmd/$b@${version}" >&2 \
    || ! CGO_ENABLED=0 go -C "$work" build -trimpath \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=${version} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}" \
      -o "$out/$b" "k8s.io/kubernetes/cmd/$b"; then
    echo "error: $b ${version} could not be built from the Go module proxy" >&2
    failed=1
  fi
done
echo "$out"
exit "$failed"
