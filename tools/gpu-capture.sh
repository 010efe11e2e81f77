#!/usr/bin/env bash
# Record a GPU host's raw tool output as a test fixture for the GPU fact detector.
#
# Usage: tools/gpu-capture.sh DIR
#
# Run it on the GPU host itself (or in a container with the host's GPUs and
# driver utilities visible). It writes the same file set as
# tests/fixtures/gpu/h200-1x, so the detector's tests can replay a new host:
#
#   nvidia-smi.txt        `nvidia-smi` (its header carries "CUDA Version: X.Y") and `uname -a`
#   nvidia-smi-q.xml      `nvidia-smi -q -x`
#   nvidia-smi-extra.txt  --query-gpu (csv with header, and the csv,noheader,nounits variant),
#                         topo -m, topo -p2p r/w/n, nvlink -s/-c, mig -lgip/-lgipp, -L, --version
#   exit-codes.txt        the exit status of every command above, one "<status> <command>" a line
#   nvml.json             NVML through nvidia-ml-py's pynvml module
#   detect.json           the detector's own output (`tmi detect`), and detect.stderr
#   README.md             a stub to complete: what the host is and what a correct detector derives
#
# Every command runs with LC_ALL=C and a timeout; a failing command is recorded,
# not fatal, because a failure (an old driver refusing a field, a host without
# NVLink) is itself something the detector must be tested against.
set -u -o pipefail

if [ "$#" -ne 1 ]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
out=$1
mkdir -p "$out"
export LC_ALL=C
timeout_s=${GPU_CAPTURE_TIMEOUT:-60}
python=${PYTHON:-python3}

: >"$out/exit-codes.txt"

# run FILE TITLE CMD...: append "== TITLE" and the command's stdout and stderr to FILE.
run() {
  local file=$1 title=$2
  shift 2
  printf '== %s\n' "$title" >>"$out/$file"
  timeout "$timeout_s" "$@" >>"$out/$file" 2>&1
  local status=$?
  printf '%s %s\n' "$status" "$*" >>"$out/exit-codes.txt"
  return 0
}

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "warning: nvidia-smi is not on PATH; its sections will record the failure" >&2
fi

: >"$out/nvidia-smi.txt"
run nvidia-smi.txt nvidia-smi nvidia-smi
run nvidia-smi.txt uname uname -a

timeout "$timeout_s" nvidia-smi -q -x >"$out/nvidia-smi-q.xml" 2>"$out/nvidia-smi-q.stderr"
printf '%s %s\n' "$?" "nvidia-smi -q -x" >>"$out/exit-codes.txt"
[ -s "$out/nvidia-smi-q.stderr" ] || rm -f "$out/nvidia-smi-q.stderr"

fields=index,uuid,name,pci.bus_id,compute_cap,driver_version,memory.total,memory.reserved,memory.used,memory.free,mig.mode.current,mig.mode.pending,persistence_mode
: >"$out/nvidia-smi-extra.txt"
run nvidia-smi-extra.txt query-gpu nvidia-smi "--query-gpu=$fields" --format=csv
run nvidia-smi-extra.txt "query-gpu noheader nounits" nvidia-smi "--query-gpu=$fields" --format=csv,noheader,nounits
# The exact query the detector's fallback makes.
run nvidia-smi-extra.txt "query-gpu detector" nvidia-smi \
  --query-gpu=index,name,compute_cap,mig.mode.current,memory.total --format=csv,nounits
run nvidia-smi-extra.txt "topo -m" nvidia-smi topo -m
run nvidia-smi-extra.txt "topo -p2p r" nvidia-smi topo -p2p r
run nvidia-smi-extra.txt "topo -p2p w" nvidia-smi topo -p2p w
run nvidia-smi-extra.txt "topo -p2p n" nvidia-smi topo -p2p n
run nvidia-smi-extra.txt "nvlink -s" nvidia-smi nvlink -s
run nvidia-smi-extra.txt "nvlink -c" nvidia-smi nvlink -c
run nvidia-smi-extra.txt "mig -lgip" nvidia-smi mig -lgip
run nvidia-smi-extra.txt "mig -lgipp" nvidia-smi mig -lgipp
run nvidia-smi-extra.txt -L nvidia-smi -L
run nvidia-smi-extra.txt version nvidia-smi --version

# NVML, in the shape of nvml.json that the tests' fake NVML reads: a value, or
# "ERR <error class>: <message>" where the call raised.
timeout "$timeout_s" "$python" - >"$out/nvml.json" 2>"$out/nvml.stderr" <<'PY'
import json
import sys

try:
    import pynvml
except ImportError as err:
    json.dump({"error": f"ERR ImportError: {err}"}, sys.stdout, indent=1)
    sys.exit(0)


def rec(fn, *args):
    try:
        value = fn(*args)
    except pynvml.NVMLError as err:
        return f"ERR {type(err).__name__}: {err}"
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, tuple):
        return list(value)
    return value


out = {}
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as err:
    out["init"] = f"ERR {type(err).__name__}: {err}"
    json.dump(out, sys.stdout, indent=1)
    sys.exit(0)
try:
    out["driver"] = rec(pynvml.nvmlSystemGetDriverVersion)
    out["cudaDriverVersion"] = rec(pynvml.nvmlSystemGetCudaDriverVersion_v2)
    out["cudaDriverVersionV1"] = rec(pynvml.nvmlSystemGetCudaDriverVersion)
    out["nvmlVersion"] = rec(pynvml.nvmlSystemGetNVMLVersion)
    # The binding has defined this as the tuple (0,) by mistake; record what it is.
    out["p2pCapsIndexReadRepr"] = repr(pynvml.NVML_P2P_CAPS_INDEX_READ)
    count = pynvml.nvmlDeviceGetCount()
    out["count"] = count
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    devices = []
    for i, h in enumerate(handles):
        d = {"index": i}
        d["name"] = rec(pynvml.nvmlDeviceGetName, h)
        d["uuid"] = rec(pynvml.nvmlDeviceGetUUID, h)
        d["cc"] = rec(pynvml.nvmlDeviceGetCudaComputeCapability, h)
        mem = rec(pynvml.nvmlDeviceGetMemoryInfo, h)
        d["memory"] = mem if isinstance(mem, str) else {
            "total": mem.total, "free": mem.free, "used": mem.used}
        d["migMode"] = rec(pynvml.nvmlDeviceGetMigMode, h)
        d["maxMigDevices"] = rec(pynvml.nvmlDeviceGetMaxMigDeviceCount, h)
        d["arch"] = rec(pynvml.nvmlDeviceGetArchitecture, h)
        d["brand"] = rec(pynvml.nvmlDeviceGetBrand, h)
        pci = rec(pynvml.nvmlDeviceGetPciInfo, h)
        d["pciBusId"] = pci if isinstance(pci, str) else (
            pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId)
        links = {}
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            state = rec(pynvml.nvmlDeviceGetNvLinkState, h, link)
            links[str(link)] = state
            if isinstance(state, str) and "InvalidArgument" in state:
                break
        d["nvlink"] = links
        profiles = {}
        for p in range(getattr(pynvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 20)):
            info = rec(pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h, p)
            profiles[str(p)] = info if isinstance(info, str) else {
                "id": info.id, "sliceCount": info.sliceCount, "memoryMiB": info.memorySizeMB,
                "instanceCount": info.instanceCount,
                "name": info.name.decode() if isinstance(info.name, bytes) else info.name}
        d["gpuInstanceProfiles"] = profiles
        devices.append(d)
    out["devices"] = devices
    # Peer read status for every ordered pair, with the literal index 0 (READ).
    p2p = {}
    for a, ha in enumerate(handles):
        for b, hb in enumerate(handles):
            if a != b:
                p2p.setdefault(str(a), {})[str(b)] = rec(pynvml.nvmlDeviceGetP2PStatus, ha, hb, 0)
    out["p2pRead"] = p2p
    topo = {}
    for a, ha in enumerate(handles):
        for b, hb in enumerate(handles):
            if a < b:
                topo[f"{a},{b}"] = rec(pynvml.nvmlDeviceGetTopologyCommonAncestor, ha, hb)
    out["topologyCommonAncestor"] = topo
finally:
    pynvml.nvmlShutdown()
json.dump(out, sys.stdout, indent=1)
sys.stdout.write("\n")
PY
printf '%s %s\n' "$?" "$python (nvml dump)" >>"$out/exit-codes.txt"
[ -s "$out/nvml.stderr" ] || rm -f "$out/nvml.stderr"

# The detector itself, from the installed owner CLI or straight from the module.
if command -v tmi >/dev/null 2>&1; then
  detect=(tmi detect)
else
  detect=("$python" -c 'import sys
from inference_policy.detection import format_block
from tmi_cli.detect import DetectionError, detect_accelerator
try:
    sys.stdout.write(format_block(detect_accelerator()))
except DetectionError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)')
fi
timeout "$timeout_s" "${detect[@]}" >"$out/detect.json" 2>"$out/detect.stderr"
printf '%s %s\n' "$?" "tmi detect" >>"$out/exit-codes.txt"
[ -s "$out/detect.stderr" ] || rm -f "$out/detect.stderr"

if [ ! -e "$out/README.md" ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | sed 's/ (UUID.*//' | sort | uniq -c | sed 's/^ *//' | paste -sd ';' -)
  cat >"$out/README.md" <<EOF
# ${gpus:-GPU host}, read on a real host ($(date -u +%Y-%m-%d))

Raw output captured with tools/gpu-capture.sh on a real machine, for testing
the GPU fact detector against real tool output rather than hand-written samples.
exit-codes.txt gives each command's exit status.

Facts a correct detector derives from this host: TODO (computeCapability,
cudaDriverMajor, features; say why p2p and nvlink are or are not present).
EOF
fi

echo "captured into $out:" >&2
ls -1 "$out" >&2
