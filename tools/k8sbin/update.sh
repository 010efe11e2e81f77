#!/usr/bin/env bash
# Regenerates go.mod/go.sum of the three wrapper modules from versions.env. Run it
# after changing a version there, then commit the result; build.sh only ever builds
# what these files pin (-mod=readonly).
#
# k8s.io/kubernetes requires its 33 staging modules (k8s.io/api, ...) at v0.0.0 and
# replaces them with ./staging/src/... paths, which a consumer cannot use; so the
# replace list is derived from the exact go.mod the module proxy serves and pointed at
# the published v0.<minor>.<patch> tags. etcd and kwok live in their own modules so
# their newer grpc/otel/x/* requirements do not move the dependency versions
# kube-apiserver was released and tested with.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
if [[ -x /usr/local/go/bin/go ]]; then
  export PATH="/usr/local/go/bin:$PATH"
fi
export GOTOOLCHAIN=local GOFLAGS=-mod=mod

staging_version="v0.${K8S_VERSION#v1.}"
k8s_gomod="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
mapfile -t staging < <(sed -n 's|^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/src/.*|\1|p' "$k8s_gomod")
if (( ${#staging[@]} == 0 )); then
  echo "error: found no staging replaces in $k8s_gomod" >&2
  exit 1
fi
echo "k8s.io/kubernetes ${K8S_VERSION}: ${#staging[@]} staging modules at ${staging_version}" >&2

regen() {  # regen <dir> <module path>; leaves an empty module with go 1.26.0
  rm -f "$1/go.mod" "$1/go.sum"
  (cd "$1" && go mod init "$2" >/dev/null 2>&1 && go mod edit -go=1.26.0)
}

regen "$here" tmi.local/k8sbin
for m in "${staging[@]}"; do
  go -C "$here" mod edit -replace="$m=$m@${staging_version}"
done
# The replaces must exist before resolving, or k8s.io/api@v0.0.0 cannot be found.
go -C "$here" get -tool \
  "k8s.io/kubernetes/cmd/kube-apiserver@${K8S_VERSION}" \
  "k8s.io/kubernetes/cmd/kube-scheduler@${K8S_VERSION}" \
  "k8s.io/kubernetes/cmd/kube-controller-manager@${K8S_VERSION}"

mkdir -p "$here/etcd" "$here/kwok"
regen "$here/etcd" tmi.local/k8sbin/etcd
go -C "$here/etcd" get -tool "go.etcd.io/etcd/server/v3@${ETCD_VERSION}"

regen "$here/kwok" tmi.local/k8sbin/kwok
go -C "$here/kwok" get -tool "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
regen "$here/helm" tmi.local/k8sbin/helm
go -C "$here/helm" get -tool "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"

regen "$here/kustomize" tmi.local/k8sbin/kustomize
go -C "$here/kustomize" get -tool "sigs.k8s.io/kustomize/kustomize/v5@${KUSTOMIZE_VERSION}"
echo "updated go.mod/go.sum in $here and its etcd, kwok, helm and kustomize modules" >&2
