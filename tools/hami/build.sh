#!/usr/bin/env bash
# Builds HAMi's scheduler (its webhook and scheduler extender, one binary) at the pinned
# release, for the side-by-side benchmark (`bench/bench_peer.py`); nothing in `make test` needs
# it. The source is HAMi's public repository at HAMI_COMMIT (v2.10: "Update HAMi-core and
# version to v2.10", then one dependency bump); its dependencies come from the Go module proxy
# through its own go.mod and go.sum. The proxy does not serve HAMi itself (its v2 tags keep a
# v1 module path), so the source is cloned, or taken from a checkout given as the argument or
# as $HAMI_SRC (it must be at HAMI_COMMIT). Builds only what is missing; prints the directory
# holding `hami-scheduler` and HAMi's chart (`charts/hami`, which the benchmark renders with
# helm for the scheduler and webhook configuration HAMi ships).
#
#   tools/hami/build.sh [SOURCE_DIR]
set -euo pipefail

HAMI_REPO="https://github.com/Project-HAMi/HAMi"
HAMI_COMMIT="4707fb02c91c545bc7343ce26dba4c32919f9a3e"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../k8sbin/lib.sh
source "$here/../k8sbin/lib.sh"
out="${TMI_HAMI_DIR:-$HOME/.cache/tmi/hami}/${HAMI_COMMIT:0:12}"
if [[ -x "$out/hami-scheduler" && -d "$out/src/charts/hami" ]]; then
  echo "$out"
  exit 0
fi
mkdir -p "$out"
source_dir="${1:-${HAMI_SRC:-}}"
if [[ -z "$source_dir" ]]; then
  source_dir="$out/clone"
  if [[ ! -d "$source_dir/.git" ]]; then
    git clone --quiet --filter=blob:none "$HAMI_REPO" "$source_dir" >&2
  fi
  git -C "$source_dir" checkout --quiet "$HAMI_COMMIT"
fi
if [[ -d "$source_dir/.git" ]] || git -C "$source_dir" rev-parse --git-dir >/dev/null 2>&1; then
  got="$(git -C "$source_dir" rev-parse HEAD)"
  if [[ "$got" != "$HAMI_COMMIT" ]]; then
    echo "error: $source_dir is at $got, not HAMI_COMMIT $HAMI_COMMIT" >&2
    exit 1
  fi
  rm -rf "$out/src"
  mkdir -p "$out/src"
  git -C "$source_dir" archive "$HAMI_COMMIT" | tar -x -C "$out/src"
else
  # A plain tree (an unpacked archive): its go.mod names the module; the commit is taken on trust.
  grep -q '^module github.com/Project-HAMi/HAMi$' "$source_dir/go.mod" \
    || { echo "error: $source_dir is not HAMi's source" >&2; exit 1; }
  rm -rf "$out/src"
  cp -r "$source_dir" "$out/src"
fi
use_go
# cgo: the NVML bindings are compiled in (and loaded only on a GPU host, never by the scheduler).
CGO_ENABLED=1 go -C "$out/src" build -trimpath -o "$out/hami-scheduler" ./cmd/scheduler >&2
echo "$HAMI_COMMIT" > "$out/COMMIT"
echo "$out"
