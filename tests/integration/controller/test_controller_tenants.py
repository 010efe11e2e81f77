"""The allocation controller reports a Pod whose accounted share sits on a GPU beside another
tenant's (`allocation_controller.neighbours`, `inference_policy.granting.grant_tenants`), against
the in-memory API server: team-b's controller follows team-a's bound engine Pods, and each move of
theirs on a node re-checks team-b's Pods there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from allocation_controller.config import ControllerSettings, settings_from_args
from allocation_controller.controller import Controller
from allocation_controller.leader import LeaderSettings
from inference_policy.granting.grant import CONDITION_TYPE
from kits import polling
from kits.controllerkit import MemoryKube
from kits.podstates import bind, planned_pod
from kits.profilekit import NOW, Owner, gpu_binding, gpu_profile, request, with_profiles

GPU0 = "kamiwaza.ai/vram-gb-gpu-0"
OURS, THEIRS = "team-b", "team-a"
CREATED = "2026-11-29T12:00:00Z"
BLOCK = {
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


def _envelope(owner: Owner, namespace: str, **sharing: Any) -> dict[str, Any]:
    share = gpu_binding(
        "share-0", allocator="vram-plugin", resource=GPU0, cc="8.9", cuda=12, memory="44Gi"
    )
    if sharing:
        share["sharing"] = sharing
    envelope = with_profiles(owner, gpu_profile("share", "accounted-share", [share]))
    envelope["namespace"] = namespace
    return envelope


def _share_pod(owner: Owner, namespace: str, name: str, node: str, **sharing: Any) -> Any:
    envelope = _envelope(owner, namespace, **sharing)
    document = request(inferenceResources=BLOCK)
    decision = owner.state(envelope, namespace=namespace).decide(document, NOW)
    assert decision.allowed, decision.body
    pod = planned_pod(name, document, decision.body, namespace=namespace, created=CREATED)
    bind(pod, node, at=CREATED)
    return pod


class Cluster:
    """Team-b's controller over a fake API server that also holds team-a's Pods."""

    def __init__(self, owner: Owner, **sharing: Any) -> None:
        self.owner = owner
        self.sharing = sharing
        self.kube = MemoryKube(OURS)
        self.kube.put(
            "configmaps",
            owner.sign(_envelope(owner, OURS, **sharing), name="kamiwaza-inference-profiles-r1"),
        )
        self.them = Owner()

    def ours(self, name: str, node: str = "l40s-1") -> None:
        self.kube.put("pods", _share_pod(self.owner, OURS, name, node, **self.sharing))

    def theirs(self, name: str, node: str = "l40s-1") -> None:
        self.kube.put("pods", _share_pod(self.them, THEIRS, name, node))

    def verdict(self, name: str) -> tuple[str, str] | None:
        pod = self.kube.get("pods", name)
        assert pod is not None
        for entry in (pod.get("status") or {}).get("conditions") or []:
            if entry["type"] == CONDITION_TYPE:
                return (entry["status"], entry["reason"])
        return None


@pytest.fixture
async def controller() -> AsyncIterator[Any]:
    running: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    def start(cluster: Cluster) -> Controller:
        loop = asyncio.get_running_loop()
        begun = loop.time()
        settings = ControllerSettings(
            policy=cluster.owner.settings(namespace=OURS),
            leader_elect=False,
            leader=LeaderSettings(name="tmi-allocation-controller", identity="ctrl-0"),
            workers=2,
            other_tenants=(THEIRS,),
        )
        found = Controller(
            cluster.kube, settings, clock=lambda: NOW + timedelta(seconds=loop.time() - begun)
        )
        stop = asyncio.Event()
        running.append((stop, loop.create_task(found.run(stop))))
        return found

    yield start
    for stop, task in running:
        stop.set()
        await asyncio.wait_for(task, 10)


async def _eventually(check: Any) -> None:
    await polling.eventually(check, what="the verdict", timeout=5.0)


async def test_a_pod_beside_another_tenants_share_is_reported_until_it_goes(
    controller: Any,
) -> None:
    cluster = Cluster(Owner())
    cluster.theirs("a-1")
    cluster.ours("b-1")
    cluster.ours("b-2", node="l40s-2")
    controller(cluster)
    await _eventually(lambda: cluster.verdict("b-1") == ("False", "SharedWithAnotherTenant"))
    await _eventually(lambda: cluster.verdict("b-2") == ("True", "Verified"))
    event = next(e for e in cluster.kube.events if e["regarding"]["name"] == "b-1")
    assert event["type"] == "Warning" and "another tenant" in event["note"]
    assert THEIRS not in event["note"]
    # Team-a's Pod leaves the node: team-b's is checked again at once, and verified.
    cluster.kube.delete("pods", "a-1")
    await _eventually(lambda: cluster.verdict("b-1") == ("True", "Verified"))
    # Another share of team-a's races onto the GPU: the verified Pod keeps its verdict, and
    # says why.
    cluster.theirs("a-2")
    await _eventually(lambda: cluster.verdict("b-1") == ("True", "VerifiedSharedWithAnotherTenant"))
    assert cluster.verdict("b-2") == ("True", "Verified")


async def test_a_pod_whose_binding_crosses_tenants_is_not_reported(controller: Any) -> None:
    cluster = Cluster(Owner(), acrossTenants=True)
    cluster.theirs("a-1")
    cluster.ours("b-1")
    controller(cluster)
    await _eventually(lambda: cluster.verdict("b-1") == ("True", "Verified"))


def test_the_tenant_namespaces_setting_names_the_others() -> None:
    owner = Owner()
    environ = {
        "TMI_NAMESPACE": OURS,
        "TMI_OWNER_PUBLIC_KEY": owner.public_key,
        "TMI_CLUSTER_BINDING_ID": "cluster-1",
        "TMI_TENANT_NAMESPACES": f"{THEIRS},{OURS},team-c,{THEIRS}",
    }
    settings = settings_from_args([], environ)
    assert settings.other_tenants == (THEIRS, "team-c")
    assert settings_from_args([], {**environ, "TMI_TENANT_NAMESPACES": ""}).other_tenants == ()
