# Shared by build.sh and build-node.sh (sourced, not run): the presence check of a cache
# directory, the Go toolchain the builds use, and the check that each go.mod pins what
# versions.env says.

all_present() {  # all_present: every name in $binaries is executable in $bin_dir
  local b
  for b in "${binaries[@]}"; do
    [[ -x "$bin_dir/$b" ]] || return 1
  done
}

use_go() {
  # Debian/Ubuntu Go packages are too old for k8s 1.36; prefer the upstream toolchain.
  if [[ -x /usr/local/go/bin/go ]]; then
    export PATH="/usr/local/go/bin:$PATH"
  fi
  command -v go >/dev/null || { echo "error: go (>= 1.26) not found on PATH" >&2; exit 1; }
  # GOTOOLCHAIN=local: never silently download a different toolchain.
  # -mod=readonly: the committed go.mod/go.sum are the pinned dependency graph.
  export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
}

check_pin() {  # check_pin <dir> <module> <expected>
  local got
  got="$(go -C "$1" list -m -f '{{.Version}}' "$2")"
  if [[ "$got" != "$3" ]]; then
    echo "error: $1/go.mod pins $2 at $got but versions.env says $3" >&2
    exit 1
  fi
}
