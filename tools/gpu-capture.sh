#!/usr/bin/env bash
# Record a GPU host's raw tool output as a test fixture for the GPU fact detector.
#
# Usage: tools/gpu-capture.sh DIR
#        tools/gpu-capture.sh --sharing DIR
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
#
# With --sharing it records a shared GPU instead, in the file set of
# tests/fixtures/gpu/h200-shared (see that README) for `tmi evidence`'s tests:
#
#   nvml-samples.json            devices, MIG instances, and SHARING_SAMPLES samples of every
#                                GPU's and MIG instance's compute processes and utilisation
#   nvidia-smi-q.xml             `nvidia-smi -q -x` (processes, MIG devices) at the last sample
#   nvidia-smi-compute-apps.csv  `--query-compute-apps=timestamp,gpu_uuid,pid,process_name,used_memory`
#   nvidia-smi-L.txt, nvidia-smi-mig-lgi.txt, nvidia-smi-mig-lci.txt
#   proc/<pid>/cgroup            each process's cgroup (the link to its Pod)
#   pods.json                    `kubectl get pods -A -o json` for this node, when kubectl works
#   evidence.json                `tmi evidence` on the capture itself, when tmi is installed
#
# Unless SHARING_PODS=1 (the workloads already run as Pods, e.g. the memory-pressure kit in
# manifests/acceptance), it starts the scenario itself on GPU 0 with the kit's probe
# (manifests/acceptance/cuda_pressure.py): two processes holding memory under two accounted
# shares (4 GiB and 2 GiB shares, each 512 MiB under) and one exceeding its 1 GiB share by
# 512 MiB, then stops them after the capture.
set -u -o pipefail

sharing=0
if [ "${1:-}" = "--sharing" ]; then
  sharing=1
  shift
fi
if [ "$#" -ne 1 ]; then
  echo "usage: $0 [--sharing] DIR" >&2
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

capture_sharing() {
  local samples=${SHARING_SAMPLES:-3} interval=${SHARING_INTERVAL:-5}
  local here probe pids=()
  here=$(cd "$(dirname "$0")/.." && pwd)
  probe="$here/manifests/acceptance/cuda_pressure.py"
  if [ "${SHARING_PODS:-0}" != 1 ]; then
    # share GiB, overshoot MiB: two within their share, one past it.
    for spec in "4 -512" "2 -512" "1 512"; do
      set -- $spec
      TMI_PLAN="{\"resources\":{\"requests\":{\"kamiwaza.ai/vram-gb-capture\":\"$1\"}}}" \
        PRESSURE_OVERSHOOT_MIB=$2 PRESSURE_HOLD_SECONDS=$((samples * interval + 30)) \
        CUDA_VISIBLE_DEVICES=0 "$python" -u "$probe" >"$out/probe-$1gib.log" 2>&1 &
      pids+=($!)
    done
    sleep "${SHARING_WARMUP:-15}"
  fi
  SHARING_SAMPLES=$samples SHARING_INTERVAL=$interval timeout $((timeout_s + samples * interval)) \
    "$python" - "$out" >"$out/nvml-samples.json" 2>"$out/nvml.stderr" <<'PY'
import json, sys, time
from datetime import datetime, timezone
import os
import pynvml

def obj(p):
    return {"pid": p.pid, "usedGpuMemory": p.usedGpuMemory,
            "gpuInstanceId": p.gpuInstanceId, "computeInstanceId": p.computeInstanceId}

def rec(fn, *args):
    try:
        return fn(*args)
    except pynvml.NVMLError as err:
        return f"ERR {type(err).__name__}: {err}"

def procs(h):
    value = rec(pynvml.nvmlDeviceGetComputeRunningProcesses, h)
    return value if isinstance(value, str) else [obj(p) for p in value]

pynvml.nvmlInit()
out = {"driver": pynvml.nvmlSystemGetDriverVersion(), "count": pynvml.nvmlDeviceGetCount(),
       "devices": [], "samples": []}
handles = []
for i in range(out["count"]):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    mode = rec(pynvml.nvmlDeviceGetMigMode, h)
    d = {"index": i, "name": pynvml.nvmlDeviceGetName(h), "uuid": pynvml.nvmlDeviceGetUUID(h),
         "memory": {"total": mem.total, "free": mem.free, "used": mem.used},
         "migMode": list(mode) if not isinstance(mode, str) else mode,
         "maxMigDevices": rec(pynvml.nvmlDeviceGetMaxMigDeviceCount, h), "migDevices": []}
    migs = []
    if isinstance(mode, (list, tuple)) and mode[0] == 1:
        for slot in range(d["maxMigDevices"]):
            m = rec(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, slot)
            if isinstance(m, str):
                continue
            mm = pynvml.nvmlDeviceGetMemoryInfo(m)
            d["migDevices"].append({"index": slot, "name": pynvml.nvmlDeviceGetName(m),
                "uuid": pynvml.nvmlDeviceGetUUID(m),
                "gpuInstanceId": pynvml.nvmlDeviceGetGpuInstanceId(m),
                "computeInstanceId": pynvml.nvmlDeviceGetComputeInstanceId(m),
                "memory": {"total": mm.total, "free": mm.free, "used": mm.used}})
            migs.append(m)
    out["devices"].append(d)
    handles.append((h, migs))
samples, interval = int(os.environ["SHARING_SAMPLES"]), float(os.environ["SHARING_INTERVAL"])
for s in range(samples):
    if s:
        time.sleep(interval)
    devices = []
    for h, migs in handles:
        util = rec(pynvml.nvmlDeviceGetProcessUtilization, h, 0)
        devices.append({
            "processes": procs(h),
            "processUtilization": util if isinstance(util, str) else [
                {"pid": u.pid, "timeStamp": u.timeStamp, "smUtil": u.smUtil, "memUtil": u.memUtil,
                 "encUtil": u.encUtil, "decUtil": u.decUtil} for u in util],
            "migDevices": [{"processes": procs(m)} for m in migs]})
    out["samples"].append({"timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                           "devices": devices})
pynvml.nvmlShutdown()
json.dump(out, sys.stdout, indent=1)
sys.stdout.write("\n")
PY
  printf '%s %s\n' "$?" "$python (nvml sharing samples)" >>"$out/exit-codes.txt"
  timeout "$timeout_s" nvidia-smi -q -x >"$out/nvidia-smi-q.xml" 2>>"$out/nvidia-smi.stderr"
  printf '%s %s\n' "$?" "nvidia-smi -q -x" >>"$out/exit-codes.txt"
  timeout "$timeout_s" nvidia-smi --query-compute-apps=timestamp,gpu_uuid,pid,process_name,used_memory \
    --format=csv >"$out/nvidia-smi-compute-apps.csv" 2>>"$out/nvidia-smi.stderr"
  printf '%s %s\n' "$?" "nvidia-smi --query-compute-apps" >>"$out/exit-codes.txt"
  timeout "$timeout_s" nvidia-smi -L >"$out/nvidia-smi-L.txt" 2>>"$out/nvidia-smi.stderr"
  timeout "$timeout_s" nvidia-smi mig -lgi >"$out/nvidia-smi-mig-lgi.txt" 2>>"$out/nvidia-smi.stderr"
  timeout "$timeout_s" nvidia-smi mig -lci >"$out/nvidia-smi-mig-lci.txt" 2>>"$out/nvidia-smi.stderr"
  for pid in $("$python" -c 'import json,sys
d=json.load(open(sys.argv[1]))
print(" ".join(sorted({str(p["pid"]) for s in d["samples"] for dev in s["devices"]
  for group in [dev["processes"]] + [m["processes"] for m in dev["migDevices"]]
  if isinstance(group, list) for p in group})))' "$out/nvml-samples.json"); do
    mkdir -p "$out/proc/$pid"
    cp "/proc/$pid/cgroup" "$out/proc/$pid/cgroup" 2>/dev/null || true
  done
  if command -v kubectl >/dev/null 2>&1; then
    kubectl get pods -A -o json --field-selector "spec.nodeName=${NODE_NAME:-$(hostname)}" \
      >"$out/pods.json" 2>>"$out/kubectl.stderr" || rm -f "$out/pods.json"
  fi
  [ -f "$out/pods.json" ] || printf '{"apiVersion": "v1", "kind": "List", "items": []}\n' >"$out/pods.json"
  if command -v tmi >/dev/null 2>&1; then
    tmi evidence --pods "$out/pods.json" --proc "$out/proc" --samples 1 >"$out/evidence.json" 2>>"$out/evidence.stderr"
    printf '%s %s\n' "$?" "tmi evidence" >>"$out/exit-codes.txt"
  fi
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for f in nvml.stderr nvidia-smi.stderr kubectl.stderr evidence.stderr; do
    [ -s "$out/$f" ] || rm -f "$out/$f"
  done
  echo "captured a shared GPU into $out:" >&2
  ls -1 "$out" >&2
}

if [ "$sharing" = 1 ]; then
  capture_sharing
  exit 0
fi

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
from inference_policy.tools.detection import format_block
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
