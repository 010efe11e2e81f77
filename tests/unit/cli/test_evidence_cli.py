"""`tmi evidence` end to end on the fixtures (the GPU reader replaced by the recorded host), the
memory-pressure probe against a fake CUDA driver, and the kit's manifests."""

from __future__ import annotations

import ctypes
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from inference_policy.base.wire import ENGINE_LABEL, PLAN_ANNOTATION, REQUEST_ANNOTATION
from inference_policy.evidence import CUDA_OOM_EXIT_CODE, classify_job_pod
from tests.evidencekit import MIG, SHARED, STATUS, FakeEvidenceNvml, FakeSmi, load
from tmi_cli import evidence_command, main
from tmi_cli.gpu_processes import NvidiaSmiReader, NvmlReader

ROOT = Path(__file__).resolve().parents[3]
KIT = ROOT / "manifests" / "acceptance"


def use_host(monkeypatch: pytest.MonkeyPatch, directory: Path, source: str = "nvml") -> None:
    def opener() -> Any:
        if source == "nvml":
            return NvmlReader(FakeEvidenceNvml(load(directory, "nvml-samples.json")))
        return NvidiaSmiReader(FakeSmi(directory))

    monkeypatch.setattr(evidence_command, "open_reader", opener)
    monkeypatch.setattr("time.sleep", lambda s: None)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    status = main.main(["evidence", *argv])
    out, err = capsys.readouterr()
    return status, (json.loads(out) if out.strip() else None), err


@pytest.mark.parametrize("source", ["nvml", "nvidia-smi"])
def test_the_shared_host_is_not_honoured_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], source: str
) -> None:
    use_host(monkeypatch, SHARED, source)
    status, report, _ = run(
        capsys,
        "--pods", str(SHARED / "pods.json"),
        "--proc", str(SHARED / "proc"),
        "--node", "gpu-h200-0",
        "--samples", "3" if source == "nvml" else "1",
        "--interval", "0",
    )  # fmt: skip
    assert status == 1
    assert report["node"] == "gpu-h200-0" and report["source"] == source
    assert report["verdict"]["notHonoured"][0].startswith("kamiwaza/tmi-memory-pressure-q7k2p@")
    # Which tenant holds the card: the namespaces of the Pods seen on it.
    (gpu,) = report["gpus"]
    assert gpu["tenants"] == ["kamiwaza", "ml-sandbox"]


def test_the_mig_host_is_honoured_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_host(monkeypatch, MIG)
    status, report, _ = run(
        capsys, "--pods", str(MIG / "pods.json"), "--proc", str(MIG / "proc"), "--samples", "2"
    )
    assert status == 0 and report["verdict"]["status"] == "honoured"
    assert len(report["samples"]) == 2
    assert all(len(gpu["tenants"]) <= 1 for gpu in report["gpus"])


def test_without_pods_every_process_is_unattributed_or_unknown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_host(monkeypatch, MIG)
    status, report, _ = run(capsys, "--proc", str(MIG / "proc"))
    # The cgroups name Pods the tool was not told about: processes outside every known grant.
    assert status == 1
    assert {b["reason"] for b in report["bypasses"]} == {"unknown-pod"}


def test_job_outcomes_off_the_gpu_host(capsys: pytest.CaptureFixture[str]) -> None:
    status, report, _ = run(
        capsys,
        "--skip-gpus",
        "--job-pod", str(STATUS / "cuda-oom.json"),
        "--job-log", str(STATUS / "cuda-oom.log"),
    )  # fmt: skip
    assert status == 0
    assert report["jobOutcomes"][0]["outcome"] == "cuda-oom"
    status, report, _ = run(
        capsys,
        "--skip-gpus",
        "--job-pod", str(STATUS / "cuda-oom.json"),
        "--job-pod", str(STATUS / "oomkilled.json"),
    )  # fmt: skip
    assert status == 1
    assert [o["outcome"] for o in report["jobOutcomes"]] == ["cuda-oom", "host-oom-killed"]


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "--pods-from-api")[0] == 2
    assert run(capsys, "--skip-gpus", "--job-log", "x")[0] == 2
    assert run(capsys, "--skip-gpus", "--post", "http://x")[0] == 2
    with pytest.raises(SystemExit) as caught:
        main.main(["evidence", "--samples", "0"])
    assert caught.value.code == 2


def test_an_unreadable_gpu_is_inconclusive_and_exits_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken() -> Any:
        return NvidiaSmiReader(FakeSmi(SHARED, missing=["nvidia-smi-q.xml"]))

    monkeypatch.setattr(evidence_command, "open_reader", broken)
    status, report, err = run(capsys)
    assert status == 3 and report is None and "nvidia-smi -q -x exited" in err


def test_a_bad_pods_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "pods.json"
    bad.write_text('{"kind": "ConfigMap"}')
    status, _, err = run(capsys, "--skip-gpus", "--pods", str(bad))
    assert status == 1 and "kubectl get pods" in err


# -- the memory-pressure probe -------------------------------------------------------------------


def probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cuda_pressure", KIT / "cuda_pressure.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeCuda:
    """The driver calls the probe makes; device memory runs out at `limit` bytes."""

    def __init__(self, total: int, limit: int, fail_init: int = 0) -> None:
        self.total, self.limit, self.fail_init = total, limit, fail_init
        self.allocated = 0

    @staticmethod
    def _set(pointer: Any, value: int) -> None:
        ctypes.cast(pointer, ctypes.POINTER(ctypes.c_size_t))[0] = value

    def cuInit(self, flags: int) -> int:
        return self.fail_init

    def cuDeviceGet(self, device: Any, ordinal: int) -> int:
        return 0

    def cuCtxCreate_v2(self, context: Any, flags: int, device: Any) -> int:
        return 0

    def cuMemGetInfo_v2(self, free: Any, total: Any) -> int:
        self._set(free, self.total - self.allocated)
        self._set(total, self.total)
        return 0

    def cuMemAlloc_v2(self, pointer: Any, size: Any) -> int:
        if self.allocated + size.value > self.limit:
            return 2
        self.allocated += size.value
        return 0

    def cuGetErrorName(self, result: int, text: Any) -> int:
        return 1


GIB = 1024**3


def plan_env(resource: str, quantity: str) -> dict[str, str]:
    plan = {"resources": {"requests": {resource: quantity}, "limits": {resource: quantity}}}
    return {"TMI_PLAN": json.dumps(plan), "PRESSURE_HOLD_SECONDS": "0"}


def test_the_probe_on_an_enforced_slice_ends_in_cuda_oom(
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = probe()
    cuda = FakeCuda(total=16 * GIB, limit=16 * GIB - 200 * 1024**2)
    held: list[float] = []
    status = module.run(cuda, plan_env("nvidia.com/mig-1g.18gb", "1"), sleep=held.append)
    log = capsys.readouterr().out
    assert status == CUDA_OOM_EXIT_CODE
    assert "outcome=cuda-oom" in log and "CUDA_ERROR_OUT_OF_MEMORY" in log
    assert held == [0.0]
    pod = load(STATUS, "cuda-oom.json")
    assert classify_job_pod(pod, log)["outcome"] == "cuda-oom"


def test_the_probe_on_an_unenforced_share_allocates_past_it_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = probe()
    cuda = FakeCuda(total=140 * GIB, limit=140 * GIB)
    status = module.run(cuda, plan_env("kamiwaza.ai/vram-gb-h200-0", "4"), sleep=lambda s: None)
    log = capsys.readouterr().out
    assert status == 0 and cuda.allocated == 5 * GIB
    assert "outcome=allocated" in log
    assert classify_job_pod(load(STATUS, "succeeded.json"), log)["passed"] is False


def test_the_probe_refuses_a_missing_plan_and_reports_cuda_failures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = probe()
    assert module.run(FakeCuda(GIB, GIB), {}) == 2
    assert module.run(FakeCuda(GIB, GIB, fail_init=100), plan_env("nvidia.com/gpu", "1")) == 3
    assert "cuInit failed" in capsys.readouterr().out


def test_the_kit_is_a_one_try_engine_job_that_reads_its_own_plan() -> None:
    kustomization = yaml.safe_load((KIT / "kustomization.yaml").read_text())
    assert kustomization["configMapGenerator"][0]["files"] == ["cuda_pressure.py"]
    job = yaml.safe_load((KIT / "memory-pressure-job.yaml").read_text())
    assert job["kind"] == "Job" and job["spec"]["backoffLimit"] == 0
    template = job["spec"]["template"]
    assert ENGINE_LABEL in template["metadata"]["labels"]
    request = json.loads(template["metadata"]["annotations"][REQUEST_ANNOTATION])
    assert request["inferenceResources"]["accelerator"]["capability"] == "gpu"
    spec = template["spec"]
    assert spec["restartPolicy"] == "Never"
    (container,) = spec["containers"]
    assert container["command"][-1] == "/kit/cuda_pressure.py"
    env = {e["name"]: e for e in container["env"]}
    assert PLAN_ANNOTATION in env["TMI_PLAN"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert container["resources"]["limits"]["memory"] == "1Gi"
    assert spec["volumes"][0]["configMap"]["name"] == kustomization["configMapGenerator"][0]["name"]
