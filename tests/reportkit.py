"""Reports for the HTML pages' tests: evidence judged on the recorded shared-GPU and MIG hosts,
and a capacity replay over a small mixed fleet that places, strands, keeps tenants apart and
refuses, each optionally carrying a hostile name a tenant could write.

The unit tests (tests/unit/cli/test_report_pages.py) and the browser test
(tests/integration/cli/test_report_browser.py) draw the same reports, so what the browser is
asked to show is what the unit tests checked the markup of.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from inference_policy.evidence import judge
from inference_policy.tools.capacity import Deployment, replay
from kits.fleetkit import h100, l40s
from kits.profilekit import EXAMPLES, NOW, Owner, gpu_binding, gpu_profile, request, with_profiles
from kits.stackkit import LARGE, whole_h100_profile
from tests.evidencekit import FakeEvidenceNvml, load, owners
from tmi_cli.evidence import collect
from tmi_cli.gpu_processes import NvmlReader

# A Pod or deployment name as a hostile tenant might write it (the API refuses it as a Pod
# name, but a report is also read from files anyone can edit).
HOSTILE = "<script>alert(1)</script>"
SHARE_RESOURCE = "kamiwaza.ai/vram-gb-gpu-0"
SHARE_BLOCK = {
    "schemaVersion": 1,
    "accelerator": {
        "capability": "gpu",
        "count": 1,
        "memory": {"minimum": "8Gi"},
        "isolation": "any-qualified",
        "profile": "share",
    },
    "runtime": {"selection": "automatic"},
}


def evidence_report(directory: Path, *, hostile: bool = False) -> dict[str, Any]:
    """The report `tmi evidence` gives for a recorded host (every sample); with `hostile`, the
    first Pod of the host is renamed HOSTILE."""
    pods = [copy.deepcopy(p) for p in load(directory, "pods.json")["items"]]
    if hostile:
        pods[0]["metadata"]["name"] = HOSTILE
    # Three seconds apart from the recording's day, so the page's time axis reads as a host's.
    dump = load(directory, "nvml-samples.json")
    times = iter(f"2026-11-29T10:00:{3 * i:02d}.000000Z" for i in range(len(dump["samples"])))
    observation = collect(
        NvmlReader(FakeEvidenceNvml(dump)), len(dump["samples"]), clock=lambda: next(times)
    )
    return judge(observation, owners(directory, observation), pods, node="gpu-h200-0")


def pod_names(report: dict[str, Any]) -> set[str]:
    """Every Pod the report names on a GPU."""
    return {str(p["pod"]) for gpu in report["gpus"] for p in gpu["pods"]}


def gpu_uuids(report: dict[str, Any]) -> set[str]:
    return {str(gpu["uuid"]) for gpu in report["gpus"]}


def capacity_fleet() -> list[dict[str, Any]]:
    """Two H100 nodes (two GPUs and one) and an L40S advertising per-GPU VRAM shares."""
    return [h100("h100-a", gpus=2).manifest(), h100("h100-b", gpus=1).manifest(),
            l40s("l40s-0").manifest()]  # fmt: skip


def capacity_report(*, hostile: bool = False) -> dict[str, Any]:
    """A replay that places whole GPUs for two tenants, strands one H100 (a two-GPU deployment
    waits), keeps a second tenant off the shared L40S and refuses an unknown engine; as
    `tmi capacity -o json` prints it."""
    owner = Owner()
    share = gpu_binding(
        "l40s-share", allocator="vram-plugin", resource=SHARE_RESOURCE, cc="8.9", cuda=12,
        memory="44Gi",
    )  # fmt: skip
    envelope = with_profiles(
        owner, whole_h100_profile(), gpu_profile("share", "accounted-share", [share])
    )
    ctx = owner.state(envelope).context(NOW)
    two_gpus = json.loads((EXAMPLES / "request-llama70b-vllm.json").read_text())
    shared = request(inferenceResources=SHARE_BLOCK)
    deployments = [
        Deployment("qwen72b-a", LARGE, "team-a"),
        Deployment("qwen72b-b", LARGE, "team-b"),
        Deployment("llama70b", two_gpus, "team-a"),
        Deployment(HOSTILE if hostile else "chat-a", shared, "team-a"),
        Deployment("chat-a2", shared, "team-a"),
        Deployment("chat-b", shared, "team-b"),
        Deployment("mystery", request("no-such-engine"), "team-c"),
    ]
    return replay(deployments, capacity_fleet(), ctx).to_json()
