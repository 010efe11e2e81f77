"""The evidence judgement (inference_policy.evidence) on the shared-GPU fixtures, through both
readers: who holds which physical GPU, who overlaps, each allocation against its grant, the
processes no grant accounts for, and the memory-pressure Pods' outcomes."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from inference_policy.evidence import (
    CUDA_OOM_EXIT_CODE,
    EvidenceError,
    GpuDevice,
    GpuProcess,
    Observation,
    ProcessOwner,
    Sample,
    classify_job_pod,
    grant_of,
    judge,
    pod_info,
    read_report,
)
from inference_policy.planning.plan import parse_plan
from tests.evidencekit import (
    GIB,
    H200_UUID,
    MIB,
    MIG,
    SHARED,
    STATUS,
    load,
    nvml_observation,
    owners,
    pods,
    smi_observation,
)

A = "kamiwaza/vllm-qwen7b-5d8f9c7b6-x2k4p"
B = "kamiwaza/llamacpp-phi3-7c9d8b5f4-m8n2q"
C = "kamiwaza/tmi-memory-pressure-q7k2p"
D = "ml-sandbox/notebook-7f9c6d5b8-ttl9w"


def report_for(directory: Any, source: str = "nvml", **changes: Any) -> dict[str, Any]:
    observation = nvml_observation(directory) if source == "nvml" else smi_observation(directory)
    return judge(
        observation, owners(directory, observation), pods(directory), node="gpu-h200-0", **changes
    )


def by_pod(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{a['namespace']}/{a['pod']}": a for a in report["allocations"]}


@pytest.mark.parametrize("source", ["nvml", "nvidia-smi"])
def test_two_shares_within_their_grant_one_over_and_two_bypasses(source: str) -> None:
    report = report_for(SHARED, source)
    allocations = by_pod(report)
    assert report["source"] == source
    assert set(allocations) == {A, B, C}
    assert {a["gpuUuid"] for a in allocations.values()} == {H200_UUID}

    a, b, c = allocations[A], allocations[B], allocations[C]
    assert (a["grantedBytes"], a["usedBytes"], a["status"]) == (23 * GIB, 22032 * MIB, "honoured")
    assert (b["grantedBytes"], b["usedBytes"], b["status"]) == (12 * GIB, 10240 * MIB, "honoured")
    assert c["grantedBytes"] == 4 * GIB and c["usedBytes"] == 5120 * MIB
    assert c["overuseBytes"] == 1 * GIB and c["findings"] == ["over-grant"]
    assert c["status"] == "not-honoured"
    assert a["bindingId"] == "h200-vram-share" and a["workload"] == "qwen7b-chat"
    assert a["isolation"] == "accounted-share" and a["memoryIsolation"].startswith("none")

    reasons = {b["pid"]: b["reason"] for b in report["bypasses"]}
    assert reasons == {39001: "not-in-a-pod", 43100: "no-gpu-grant"}
    verdict = report["verdict"]
    assert verdict["status"] == "not-honoured" and verdict["honoured"] is False
    assert verdict["notHonoured"] == [f"{C}@{H200_UUID}"]
    assert verdict["bypassProcesses"] == 2

    (gpu,) = report["gpus"]
    assert gpu["uuid"] == H200_UUID and gpu["memoryTotalBytes"] == 143771 * MIB
    assert [f"{p['namespace']}/{p['pod']}" for p in gpu["pods"]] == sorted([A, B, C, D])
    # The notebook's namespace is another tenant's: the card is not one tenant's alone.
    assert gpu["tenants"] == ["kamiwaza", "ml-sandbox"]
    assert gpu["unaccountedProcesses"] == 2
    assert gpu["unaccountedBytes"] == (1536 + 2048) * MIB


def test_overlap_in_time_is_read_from_the_samples() -> None:
    report = report_for(SHARED)
    overlaps = {tuple(o["holders"]): o for o in report["overlaps"]}
    assert overlaps[(B, A)]["samples"] == [0, 1, 2]
    # The pressure Pod started in sample 1, the notebook in sample 2.
    assert overlaps[(C, A)]["samples"] == [1, 2]
    assert overlaps[(A, D)]["samples"] == [2]
    assert overlaps[(A, "pid:39001")]["samples"] == [0, 1, 2]
    assert all(o["sameMemory"] for o in report["overlaps"])
    assert [s["index"] for s in report["samples"]] == [0, 1, 2]


def test_one_sample_shows_no_overlap_the_recording_does_not_have() -> None:
    observation = nvml_observation(SHARED, samples=1)
    report = judge(observation, owners(SHARED, observation), pods(SHARED))
    holders = {tuple(o["holders"]) for o in report["overlaps"]}
    assert (B, A) in holders
    assert not any(C in pair or D in pair for pair in holders)
    # Before the pressure Pod started, every share was within its grant.
    assert all(a["status"] == "honoured" for a in report["allocations"])


def test_without_the_over_user_and_the_bypasses_every_share_is_honoured() -> None:
    observation = nvml_observation(SHARED)
    keep = {41021, 41377}
    trimmed = replace(
        observation,
        samples=tuple(
            replace(s, processes=tuple(p for p in s.processes if p.pid in keep))
            for s in observation.samples
        ),
    )
    report = judge(trimmed, owners(SHARED, trimmed), pods(SHARED))
    assert report["verdict"]["status"] == "honoured"
    assert report["bypasses"] == []
    assert report["idlePods"] == [C]


def test_vllm_budget_beyond_a_small_share_is_noted_but_judged_on_use() -> None:
    allocations = by_pod(report_for(SHARED))
    # 0.03 of the 143771 MiB card is more than the 4 GiB share the plan grants.
    assert allocations[C]["engineBudgetBytes"] == int(0.03 * 150754820096)
    assert allocations[C]["notes"] == ["engine-budget-exceeds-grant", "shared-across-tenants"]
    assert allocations[A]["notes"] == ["shared-across-tenants"]
    assert allocations[A]["engineBudgetBytes"] == int(0.15 * 150754820096)
    assert allocations[A]["smUtilPercentMax"] == 61


@pytest.mark.parametrize("source", ["nvml", "nvidia-smi"])
def test_mig_slices_are_granted_their_slice_and_share_the_card_not_its_memory(source: str) -> None:
    report = report_for(MIG, source)
    allocations = by_pod(report)
    assert report["verdict"]["status"] == "honoured"
    e = allocations["kamiwaza/llamacpp-llama70b-q4-6c5d4b3a2-p9r8s"]
    f = allocations["kamiwaza/vllm-qwen7b-mig-8f7e6d5c4-a1b2c"]
    g = allocations["kamiwaza/tmi-memory-pressure-mig-w4x5y"]
    assert (e["migInstance"], e["migProfile"], e["grantedBytes"]) == (2, "3g.71gb", 71424 * MIB)
    assert e["migUuid"] == "MIG-2f6b8a6e-0c1d-5e4f-9a3b-7d2c1e0f4a51"
    assert (f["migInstance"], f["migProfile"], f["grantedBytes"]) == (7, "1g.18gb", 16 * GIB)
    assert g["migInstance"] == 8 and g["usedBytes"] == 16100 * MIB
    assert all(a["memoryIsolation"] == "hardware (MIG slice)" for a in allocations.values())
    assert all(a["gpuUuid"] == H200_UUID for a in allocations.values())
    assert report["overlaps"] and not any(o["sameMemory"] for o in report["overlaps"])
    (gpu,) = report["gpus"]
    assert gpu["migEnabled"] is True
    assert [m["gpuInstanceId"] for m in gpu["migInstances"]] == [2, 7, 8]


# -- synthetic hosts for the remaining rules -----------------------------------------------------

CARD = GpuDevice(H200_UUID, 0, "NVIDIA H200", 143771 * MIB)
OTHER = GpuDevice("GPU-0f0f0f0f-1111-2222-3333-444455556666", 1, "NVIDIA H200", 143771 * MIB)


def planned(
    uid: str, resource: str, quantity: str = "1", name: str | None = None
) -> dict[str, Any]:
    pod = copy.deepcopy(pods(SHARED)[1])
    pod["metadata"]["uid"] = uid
    pod["metadata"]["name"] = name or f"pod-{uid[:4]}"
    text = json.loads(pod["metadata"]["annotations"]["kamiwaza.ai/plan"])
    text["resources"] = {"requests": {resource: quantity}, "limits": {resource: quantity}}
    pod["metadata"]["annotations"]["kamiwaza.ai/plan"] = json.dumps(text)
    return pod


def one_sample(*processes: GpuProcess) -> tuple[Sample, ...]:
    return (Sample(0, "t", processes),)


UID1 = "11111111-1111-4111-8111-111111111111"
UID2 = "22222222-2222-4222-8222-222222222222"


def test_a_whole_device_with_anyone_else_on_it_is_not_honoured() -> None:
    observation = Observation(
        "nvml",
        None,
        (CARD,),
        one_sample(GpuProcess(1, H200_UUID, 40 * GIB), GpuProcess(2, H200_UUID, GIB)),
    )
    owned = {1: ProcessOwner(UID1), 2: ProcessOwner(UID2)}
    report = judge(
        observation,
        owned,
        [planned(UID1, "nvidia.com/gpu"), planned(UID2, "kamiwaza.ai/vram-gb-x", "2")],
    )
    whole = next(a for a in report["allocations"] if a["podUid"] == UID1)
    assert whole["grantedBytes"] == 143771 * MIB
    assert whole["findings"] == ["device-shared"] and whole["status"] == "not-honoured"
    alone = judge(
        replace(observation, samples=one_sample(GpuProcess(1, H200_UUID, 40 * GIB))),
        owned,
        [planned(UID1, "nvidia.com/gpu")],
    )
    assert alone["verdict"]["status"] == "honoured"


def test_an_accounted_share_on_two_cards_is_not_honoured() -> None:
    observation = Observation(
        "nvml",
        None,
        (CARD, OTHER),
        one_sample(GpuProcess(1, CARD.uuid, GIB), GpuProcess(2, OTHER.uuid, GIB)),
    )
    owned = {1: ProcessOwner(UID1), 2: ProcessOwner(UID1)}
    report = judge(observation, owned, [planned(UID1, "kamiwaza.ai/vram-gb-x", "4")])
    assert {a["gpuUuid"] for a in report["allocations"]} == {CARD.uuid, OTHER.uuid}
    assert all("share-spans-devices" in a["findings"] for a in report["allocations"])


def test_a_mig_grant_off_its_slice_or_on_another_profile_is_not_honoured() -> None:
    device = nvml_observation(MIG).devices[0]
    on_card = Observation(
        "nvml",
        None,
        (replace(device, mig_instances=()),),
        one_sample(GpuProcess(1, H200_UUID, GIB)),
    )
    report = judge(on_card, {1: ProcessOwner(UID1)}, [planned(UID1, "nvidia.com/mig-1g.18gb")])
    assert report["allocations"][0]["findings"] == ["not-on-mig-slice"]
    wrong = Observation(
        "nvml", None, (device,), one_sample(GpuProcess(1, H200_UUID, GIB, gpu_instance_id=2))
    )
    report = judge(wrong, {1: ProcessOwner(UID1)}, [planned(UID1, "nvidia.com/mig-1g.18gb")])
    assert report["allocations"][0]["findings"] == ["slice-profile-mismatch"]
    # The single strategy grants nvidia.com/gpu on a MIG device: the slice is the grant.
    single = judge(wrong, {1: ProcessOwner(UID1)}, [planned(UID1, "nvidia.com/gpu")])
    assert single["allocations"][0]["grantedBytes"] == 71424 * MIB
    assert single["verdict"]["status"] == "honoured"


def test_unknown_memory_and_unattributed_processes_are_inconclusive_not_honoured() -> None:
    observation = Observation("nvml", None, (CARD,), one_sample(GpuProcess(1, H200_UUID, None)))
    report = judge(
        observation, {1: ProcessOwner(UID1)}, [planned(UID1, "kamiwaza.ai/vram-gb-x", "4")]
    )
    assert report["allocations"][0]["status"] == "inconclusive"
    assert report["verdict"]["status"] == "inconclusive"
    gone = judge(replace(observation, samples=one_sample(GpuProcess(9, H200_UUID, GIB))), {}, [])
    assert gone["bypasses"][0]["reason"] == "unattributed"
    assert gone["verdict"]["status"] == "inconclusive"
    assert gone["verdict"]["bypassProcesses"] == 0


def test_a_context_in_a_container_other_than_the_engine_is_a_bypass() -> None:
    sidecar = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
    a_uid = pods(SHARED)[0]["metadata"]["uid"]
    observation = Observation("nvml", None, (CARD,), one_sample(GpuProcess(7, H200_UUID, GIB)))
    report = judge(observation, {7: ProcessOwner(a_uid, sidecar)}, pods(SHARED))
    assert report["bypasses"][0]["reason"] == "unplanned-container"
    assert report["bypasses"][0]["pod"] == "vllm-qwen7b-5d8f9c7b6-x2k4p"
    assert report["allocations"] == []
    assert report["verdict"]["status"] == "not-honoured"


def test_a_process_on_a_gpu_the_reader_did_not_list_is_inconclusive() -> None:
    observation = Observation("nvml", None, (CARD,), one_sample(GpuProcess(1, OTHER.uuid, GIB)))
    report = judge(observation, {1: ProcessOwner(UID1)}, [planned(UID1, "nvidia.com/gpu")])
    assert report["verdict"]["status"] == "inconclusive"
    assert OTHER.uuid in report["verdict"]["inconclusive"][0]


def test_grants_come_from_the_plan() -> None:
    plan = parse_plan(pods(SHARED)[0]["metadata"]["annotations"]["kamiwaza.ai/plan"])
    grant = grant_of(plan)
    assert grant is not None
    assert (grant.isolation, grant.quantity, grant.engine_memory_fraction) == (
        "accounted-share",
        23,
        0.15,
    )
    assert grant_of(None) is None
    info = pod_info(pods(SHARED)[3])
    assert info is not None and info.plan is None and info.plan_error
    assert pod_info({"metadata": {"name": "no-uid"}}) is None


# -- the memory-pressure outcome -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "outcome"),
    [
        ("cuda-oom", "cuda-oom"),
        ("pytorch-oom", "cuda-oom"),
        ("oomkilled", "host-oom-killed"),
        ("succeeded", "succeeded"),
        ("failed", "failed"),
    ],
)
def test_a_finished_pressure_pod_is_classified_from_its_status_and_log(
    name: str, outcome: str
) -> None:
    pod = load(STATUS, f"{name}.json")
    result = classify_job_pod(pod, (STATUS / f"{name}.log").read_text())
    assert result["outcome"] == outcome
    assert result["passed"] is (outcome == "cuda-oom")
    assert result["container"] == "engine"


def test_the_kits_exit_code_needs_no_log_and_a_log_never_overrides_oomkilled() -> None:
    oom = load(STATUS, "cuda-oom.json")
    assert classify_job_pod(oom)["exitCode"] == CUDA_OOM_EXIT_CODE
    assert classify_job_pod(oom)["outcome"] == "cuda-oom"
    killed = load(STATUS, "oomkilled.json")
    # A CUDA line in the log does not turn a kernel OOM kill into a CUDA error.
    log = (STATUS / "cuda-oom.log").read_text()
    assert classify_job_pod(killed, log)["outcome"] == "host-oom-killed"
    assert classify_job_pod(load(STATUS, "evicted.json"))["outcome"] == "evicted"
    assert classify_job_pod(load(STATUS, "running.json"))["outcome"] == "not-finished"
    assert (
        "nothing on this GPU enforces" in classify_job_pod(load(STATUS, "succeeded.json"))["detail"]
    )


def test_a_failed_pressure_pod_fails_the_report() -> None:
    outcome = classify_job_pod(load(STATUS, "succeeded.json"))
    report = report_for(MIG, job_outcomes=[outcome])
    assert report["verdict"]["status"] == "not-honoured"
    assert report["verdict"]["failedJobs"] == ["kamiwaza/tmi-memory-pressure-z8v1m"]
    passed = report_for(MIG, job_outcomes=[classify_job_pod(load(STATUS, "cuda-oom.json"))])
    assert passed["verdict"]["status"] == "honoured"


# -- reading a report back -----------------------------------------------------------------------


def test_read_report_gives_the_collector_its_rows() -> None:
    view = read_report(json.loads(json.dumps(report_for(SHARED))))
    assert view.node == "gpu-h200-0" and view.status == "not-honoured"
    rows = {r.pod: r for r in view.allocations}
    over = rows["tmi-memory-pressure-q7k2p"]
    assert (over.granted_bytes, over.used_bytes, over.overuse_bytes) == (4 * GIB, 5 * GIB, GIB)
    assert over.binding == "h200-vram-share" and over.gpu_uuid == H200_UUID
    (gpu,) = view.gpus
    assert (gpu.unaccounted_processes, gpu.pods, gpu.overlapping_pairs) == (2, 4, 10)


@pytest.mark.parametrize(
    "damage",
    [
        lambda r: r.update(kind="other"),
        lambda r: r.update(schemaVersion=2),
        lambda r: r.update(node=""),
        lambda r: r["verdict"].update(status="fine"),
        lambda r: r["allocations"][0].update(usedBytes=-1),
        lambda r: r["allocations"][0].update(usedBytes=True),
        lambda r: r["allocations"][0].update(pod="x" * 300),
        lambda r: r["allocations"][0].update(status="great"),
        lambda r: r.update(allocations={}),
        lambda r: r["gpus"][0].update(uuid=None),
    ],
)
def test_read_report_refuses_what_judge_would_not_write(damage: Any) -> None:
    report = report_for(SHARED)
    damage(report)
    with pytest.raises(EvidenceError):
        read_report(report)
    with pytest.raises(EvidenceError):
        read_report([report])
