# Shared by build.sh, build-node.sh and build-fakedra.sh (sourced, not run): the presence
# check of a cache directory, the Go toolchain the builds use, the check that each go.mod pins
# what versions.env says, and the progress lines of a build.

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

# Progress of a build, one line per component on stderr (stdout is the directory built):
#   build_begin <build> <component>...   what will be built, and about how long it takes
#   step_begin <component> <what>        this component's turn, time spent, time left
#   step_end                             how long it took (kept as the next build's estimate)
#   build_end                            the whole build's time
# The estimates (localcluster/plane/build_progress.py, the standard library only) come from
# the last build's times in ~/.cache/tmi/build-times.json, else typical figures. Without a
# Python the lines say only which component is building.
_progress() {
  local py="" script
  script="$(dirname "${BASH_SOURCE[0]}")/../../localcluster/plane/build_progress.py"
  if [[ -x "${TMI_BUILD_PYTHON:-}" ]]; then
    py="$TMI_BUILD_PYTHON"
  elif command -v python3 >/dev/null; then
    py="$(command -v python3)"
  fi
  if [[ -n "$py" && -f "$script" ]] && "$py" "$script" "$@" >&2; then
    return 0
  fi
  case "$1" in
    step) echo ">> [$3/$4] building $7" >&2 ;;
    finish) echo ">> $2: built in $3s" >&2 ;;
  esac
  return 0
}

build_begin() {  # build_begin <build> <component>...
  _build_name="$1"
  shift
  _build_todo=("$@")
  _build_index=0
  _build_start=$(date +%s)
  _progress plan "$_build_name" "$@"
}

step_begin() {  # step_begin <component> <what>
  _step_name="$1"
  _build_index=$((_build_index + 1))
  _step_start=$(date +%s)
  _progress step "$_build_name" "$_build_index" "${#_build_todo[@]}" \
    "$((_step_start - _build_start))" "$1" "$2" "${_build_todo[@]:_build_index}"
}

step_end() {
  _progress done "$_build_name" "$_step_name" "$(($(date +%s) - _step_start))"
}

build_end() {
  _progress finish "$_build_name" "$(($(date +%s) - _build_start))"
}
