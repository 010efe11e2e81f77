#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok, helm, kustomize
# and tmi-oci (ocibuild/: an OCI image layout from layer tarballs, with go-containerregistry)
# from the Go module proxy into a versioned cache directory outside the checkout, so
# CI (and developers) pay the slow first build once and reuse the binaries afterwards. No-op
# when all of them are present.
#
#   tools/k8sbin/build.sh            # build (or reuse) and print the directory
#   TMI_K8S_BIN_DIR=/some/dir tools/k8sbin/build.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=lib.sh
source "$here/lib.sh"

key="${K8S_VERSION}-etcd${ETCD_VERSION#v}-kwok${KWOK_VERSION#v}-helm${HELM_VERSION#v}-kustomize${KUSTOMIZE_VERSION#v}"
bin_dir="${TMI_K8S_BIN_DIR:-$HOME/.cache/tmi/k8sbin/$key}"
binaries=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl kwok helm kustomize tmi-oci)

if all_present; then
  echo "control-plane binaries already present (${key}): $bin_dir" >&2
  echo "$bin_dir"
  exit 0
fi

use_go
export CGO_ENABLED=0
check_pin "$here" k8s.io/kubernetes "$K8S_VERSION"
check_pin "$here/etcd" go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
check_pin "$here/kwok" sigs.k8s.io/kwok "$KWOK_VERSION"
check_pin "$here/helm" helm.sh/helm/v3 "$HELM_VERSION"
check_pin "$here/kustomize" sigs.k8s.io/kustomize/kustomize/v5 "$KUSTOMIZE_VERSION"

# Build into a sibling temp dir and rename at the end, so an interrupted build never
# leaves a half-filled directory that the presence check would accept.
mkdir -p "$(dirname "$bin_dir")"
tmp="$(mktemp -d "${bin_dir}.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"  # mktemp makes it 0700; CI caches and other users need to read it

k8s_minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
k8s_ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=${k8s_minor} \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION} \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=${k8s_minor}"

# A cache that lacks only some binaries (one added since it was built) builds only those.
needed() {  # needed <name>: not yet in the cache
  [[ ! -x "$bin_dir/$1" ]]
}

k8s_cmds=()
for b in kube-apiserver kube-scheduler kube-controller-manager kubectl; do
  needed "$b" && k8s_cmds+=("k8s.io/kubernetes/cmd/$b")
done
# What this run builds, in order, so each step can say how much is left.
todo=()
((${#k8s_cmds[@]})) && todo+=(kubernetes)
for b in etcd kwok helm kustomize tmi-oci; do
  needed "$b" && todo+=("$b")
done
build_begin controlplane "${todo[@]}"

if ((${#k8s_cmds[@]})); then
  step_begin kubernetes "${k8s_cmds[*]##*/} ${K8S_VERSION}"
  go -C "$here" build -trimpath -ldflags "$k8s_ldflags" -o "$tmp/" "${k8s_cmds[@]}"
  step_end
fi

if needed etcd; then
  step_begin etcd "etcd ${ETCD_VERSION}"
  # The package's default binary name would be "server".
  go -C "$here/etcd" build -trimpath \
    -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=${ETCD_VERSION}" \
    -o "$tmp/etcd" go.etcd.io/etcd/server/v3
  step_end
fi

if needed kwok; then
  step_begin kwok "kwok ${KWOK_VERSION}"
  go -C "$here/kwok" build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
    -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok
  step_end
fi

if needed helm; then
  step_begin helm "helm ${HELM_VERSION}"
  # Without the k8sVersion stamps (helm's own Makefile sets them) `helm template` and `helm lint`
  # assume Kubernetes v1.20 and refuse the chart's kubeVersion.
  helm_k8s="$(go -C "$here/helm" list -m -f '{{.Version}}' k8s.io/client-go)"
  helm_k8s_minor="$(echo "$helm_k8s" | cut -d. -f2)"
  helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    helm_ldflags+=" -X ${pkg}.k8sVersionMajor=1 -X ${pkg}.k8sVersionMinor=${helm_k8s_minor}"
  done
  go -C "$here/helm" build -trimpath -ldflags "$helm_ldflags" \
    -o "$tmp/helm" helm.sh/helm/v3/cmd/helm
  step_end
fi

if needed kustomize; then
  step_begin kustomize "kustomize ${KUSTOMIZE_VERSION}"
  go -C "$here/kustomize" build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kustomize/api/provenance.version=${KUSTOMIZE_VERSION}" \
    -o "$tmp/kustomize" sigs.k8s.io/kustomize/kustomize/v5
  step_end
fi

if needed tmi-oci; then
  step_begin tmi-oci "tmi-oci (go-containerregistry)"
  go -C "$here/ocibuild" build -trimpath -ldflags "-s -w" -o "$tmp/tmi-oci" .
  step_end
fi

printf 'K8S_VERSION=%s\nETCD_VERSION=%s\nKWOK_VERSION=%s\nHELM_VERSION=%s\nKUSTOMIZE_VERSION=%s\nGO=%s\n' \
  "$K8S_VERSION" "$ETCD_VERSION" "$KWOK_VERSION" "$HELM_VERSION" "$KUSTOMIZE_VERSION" \
  "$(go env GOVERSION)" > "$tmp/VERSIONS"

# Another build may have finished first; keep whichever directory is complete. A directory
# that only lacks binaries added since it was built gets just those, each by an atomic rename,
# so processes already running from it are never disturbed.
if all_present; then
  echo "another build finished first; keeping $bin_dir" >&2
elif [[ -d "$bin_dir" ]]; then
  for b in "${binaries[@]}"; do
    [[ -x "$bin_dir/$b" ]] || mv "$tmp/$b" "$bin_dir/$b"
  done
  cp "$tmp/VERSIONS" "$bin_dir/VERSIONS.tmp" && mv "$bin_dir/VERSIONS.tmp" "$bin_dir/VERSIONS"
else
  mv "$tmp" "$bin_dir"
  trap - EXIT
fi
build_end
echo "$bin_dir"
