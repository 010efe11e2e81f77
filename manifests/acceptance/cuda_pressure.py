"""Memory-pressure probe: allocate GPU memory past this Pod's grant and report how it ended.

Runs inside the engine image the plan names (any image with python3; the NVIDIA container
runtime mounts libcuda.so.1). It calls the CUDA driver API through ctypes, so it needs no CUDA
toolkit and no Python package, and it holds almost no host memory: a host OOM kill here means
the container's memory limit is wrong, not that the GPU ran out.

The grant comes from the Pod's own plan (TMI_PLAN, from the kamiwaza.ai/plan annotation through
the downward API): an accounted share is its `kamiwaza.ai/vram-gb-*` quantity in GiB, a MIG slice
or whole device is the memory the device reports. The target is the grant plus
PRESSURE_OVERSHOOT_MIB. Exit status: 42 when the driver refused an allocation before the target
(CUDA_ERROR_OUT_OF_MEMORY: the grant is enforced), 0 when the whole target was allocated (nothing
enforces the grant), 3 for any other CUDA failure, 2 for a bad setting. Either way the memory is
held for PRESSURE_HOLD_SECONDS first, so `tmi evidence --samples` on the node can see it.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from typing import Any

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
EXIT_CUDA_OOM = 42
EXIT_ALLOCATED = 0
EXIT_USAGE = 2
EXIT_CUDA_ERROR = 3
GIB = 1024**3
MIB = 1024**2
VRAM_PREFIX = "kamiwaza.ai/vram-gb-"


def say(message: str) -> None:
    print(f"tmi-memory-pressure: {message}", flush=True)


def share_bytes(plan_text: str) -> tuple[int | None, str]:
    """The accounted share the plan grants (None: a MIG slice or whole device)."""
    plan = json.loads(plan_text)
    for name, value in ((plan.get("resources") or {}).get("requests") or {}).items():
        if name.startswith(VRAM_PREFIX):
            return int(value) * GIB, f"{name}={value}"
        if name.startswith("nvidia.com/"):
            return None, f"{name}={value}: the device"
    raise ValueError("the plan requests no NVIDIA GPU resource")


def load_cuda() -> Any:
    return ctypes.CDLL("libcuda.so.1")


def run(cuda: Any, environ: dict[str, str], sleep: Any = time.sleep) -> int:
    try:
        overshoot = int(environ.get("PRESSURE_OVERSHOOT_MIB", "1024")) * MIB
        chunk = int(environ.get("PRESSURE_CHUNK_MIB", "256")) * MIB
        hold = float(environ.get("PRESSURE_HOLD_SECONDS", "30"))
        share, what = share_bytes(environ["TMI_PLAN"])
    except (KeyError, ValueError) as exc:
        say(f"bad setting: {exc}")
        return EXIT_USAGE

    def check(result: int, call: str) -> None:
        if result != CUDA_SUCCESS:
            raise RuntimeError(f"{call} failed: {name_of(cuda, result)} ({result})")

    try:
        check(cuda.cuInit(0), "cuInit")
        device = ctypes.c_int()
        check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
        context = ctypes.c_void_p()
        check(cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device), "cuCtxCreate")
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    except RuntimeError as exc:
        say(str(exc))
        return EXIT_CUDA_ERROR
    grant = share if share is not None else total.value
    target = grant + overshoot
    say(f"device total {total.value} bytes, free {free.value} bytes")
    say(f"grant {grant} bytes ({what}), target {target} bytes")

    held: list[ctypes.c_uint64] = []
    allocated = 0
    status = EXIT_ALLOCATED
    while allocated < target:
        size = min(chunk, target - allocated)
        pointer = ctypes.c_uint64()
        result = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size))
        if result == CUDA_ERROR_OUT_OF_MEMORY:
            say(f"allocated {allocated} bytes")
            say(f"cuMemAlloc of {size} bytes failed: CUDA_ERROR_OUT_OF_MEMORY ({result})")
            status = EXIT_CUDA_OOM
            break
        if result != CUDA_SUCCESS:
            say(f"cuMemAlloc of {size} bytes failed: {name_of(cuda, result)} ({result})")
            return EXIT_CUDA_ERROR
        held.append(pointer)
        allocated += size
    if status == EXIT_ALLOCATED:
        say(f"allocated {allocated} bytes")
    outcome = "cuda-oom" if status == EXIT_CUDA_OOM else "allocated"
    say(f"outcome={outcome} allocated={allocated} target={target}")
    # Hold the memory so a sampling `tmi evidence` on the node sees this Pod's use.
    sleep(hold)
    return status


def name_of(cuda: Any, result: int) -> str:
    text = ctypes.c_char_p()
    try:
        if cuda.cuGetErrorName(result, ctypes.byref(text)) == CUDA_SUCCESS and text.value:
            return str(text.value.decode())
    except AttributeError:
        pass
    return "CUDA error"


if __name__ == "__main__":
    try:
        library = load_cuda()
    except OSError as err:
        say(f"cannot load libcuda.so.1: {err} (is the Pod on the NVIDIA runtime?)")
        sys.exit(EXIT_CUDA_ERROR)
    sys.exit(run(library, dict(os.environ)))
