"""One controller process for every tenant namespace (`allocation_controller.fleet`), against the
in-memory API server: each tenant checked against its own owner's profile through its own
namespaced port, one Lease whose holder writes for every tenant and whose loss stops them all,
neighbours' shares fed from the tenants' own Pod informers (one Pod watch per namespace), and
one /metrics, /readyz and /healthz for the process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from allocation_controller.app import create_app
from allocation_controller.config import ControllerSettings
from allocation_controller.fleet import Fleet
from allocation_controller.leader import LeaderSettings
from inference_policy.granting.grant import CONDITION_TYPE
from inference_policy.granting.kept_pod import MAX_KEPT_POD_BYTES
from kits import polling
from kits.controllerkit import MemoryKube
from kits.podstates import bind, planned_pod
from kits.profilekit import NOW, Owner, gpu_binding, gpu_profile, request, with_profiles

A, B = "team-a", "team-b"
OWNER_NS = "tmi-system"
LEASE = "tmi-allocation-controller"
GPU0 = "kamiwaza.ai/vram-gb-gpu-0"
CREATED = "2026-11-29T12:00:00Z"
FAST_LEADER = {"lease_duration": 1.5, "renew_deadline": 1.0, "retry_period": 0.1}
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


def _envelope(owner: Owner, namespace: str) -> dict[str, Any]:
    share = gpu_binding(
        "share-0", allocator="vram-plugin", resource=GPU0, cc="8.9", cuda=12, memory="44Gi"
    )
    envelope = with_profiles(owner, gpu_profile("share", "accounted-share", [share]))
    envelope["namespace"] = namespace
    return envelope


@dataclass
class Server:
    """One fake API server, a port per tenant namespace, and each tenant's own owner key."""

    kube: MemoryKube = field(default_factory=lambda: MemoryKube(A))
    owners: dict[str, Owner] = field(default_factory=lambda: {A: Owner(), B: Owner()})

    def __post_init__(self) -> None:
        self.ports = {A: self.kube, B: self.kube.beside(B)}
        for namespace, owner in self.owners.items():
            configmap = owner.sign(_envelope(owner, namespace), name=f"profiles-{namespace}")
            self.ports[namespace].put("configmaps", configmap)

    def settings(self, identity: str = "ctrl-0", **changes: Any) -> ControllerSettings:
        tenants = tuple(owner.settings(namespace=ns) for ns, owner in self.owners.items())
        values: dict[str, Any] = {
            "policy": tenants[0],
            "tenants": tenants,
            "leader": LeaderSettings(name=LEASE, identity=identity, **FAST_LEADER),
            "lease_namespace": OWNER_NS,
            "workers": 2,
            "rights_seconds": 0.2,
        }
        values.update(changes)
        return ControllerSettings(**values)

    def pod(self, namespace: str, name: str, node: str | None = "l40s-1", **extra: Any) -> None:
        owner = self.owners[namespace]
        document = request(inferenceResources=SHARE_BLOCK)
        decision = owner.state(_envelope(owner, namespace), namespace=namespace).decide(
            document, NOW
        )
        assert decision.allowed, decision.body
        pod = planned_pod(name, document, decision.body, namespace=namespace, created=CREATED)
        pod["metadata"]["annotations"].update(extra)
        if node is not None:
            bind(pod, node, at=CREATED)
        self.ports[namespace].put("pods", pod)

    def verdict(self, name: str) -> tuple[str, str] | None:
        pod = self.kube.get("pods", name)
        assert pod is not None
        for entry in (pod.get("status") or {}).get("conditions") or []:
            if entry["type"] == CONDITION_TYPE:
                return (entry["status"], entry["reason"])
        return None

    def pod_watches(self) -> list[str]:
        """The namespace of each open Pod watch, every port's."""
        return sorted(str(w.namespace) for w in self.kube._watchers if w.resource == "pods")


class Running:
    def __init__(self, server: Server, settings: ControllerSettings) -> None:
        loop = asyncio.get_running_loop()
        begun = loop.time()
        self.fleet = Fleet(
            [server.ports[t.namespace] for t in settings.every_tenant()],
            settings,
            lease=server.kube,
            clock=lambda: NOW + timedelta(seconds=loop.time() - begun),
        )
        self.stop = asyncio.Event()
        self.task = loop.create_task(self.fleet.run(self.stop))

    @property
    def identity(self) -> str:
        return self.fleet.settings.leader.identity

    def working(self) -> bool:
        """Every tenant's workers started."""
        return all(c.leading and c._workers for c in self.fleet.controllers)

    def idle(self) -> bool:
        """No tenant's workers running or starting."""
        return all(
            not c.leading and not c._workers and c._starting is None for c in self.fleet.controllers
        )

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)


@pytest.fixture
async def running() -> AsyncIterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(server: Server, identity: str = "ctrl-0", **changes: Any) -> Running:
        instance = Running(server, server.settings(identity, **changes))
        started.append(instance)
        return instance

    yield start
    for instance in started:
        if not instance.task.done():
            await instance.close()


async def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    code = check.__code__
    what = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno} to hold"
    return await polling.eventually(check, what=what, timeout=timeout)


async def test_one_lease_and_each_tenant_checked_against_its_own_owner(
    running: Callable[..., Running],
) -> None:
    server = Server()
    server.pod(A, "a-1", node="l40s-1")
    server.pod(B, "b-1", node="l40s-2")
    instance = running(server)
    await eventually(lambda: server.verdict("a-1") == ("True", "Verified"))
    await eventually(lambda: server.verdict("b-1") == ("True", "Verified"))
    (lease,) = server.kube.objects["leases"].values()
    assert lease["metadata"]["name"] == LEASE
    assert lease["metadata"]["namespace"] == OWNER_NS
    assert lease["spec"]["holderIdentity"] == instance.identity
    # Each tenant's Events are in its own namespace, written through its own port.
    regarding = {e["regarding"]["name"]: e["metadata"]["namespace"] for e in server.kube.events}
    assert regarding == {"a-1": A, "b-1": B}
    # Team-b's Pod, checked against team-a's owner key alone, would be refused: each tenant has
    # its own trust.
    a, b = instance.fleet.controllers
    assert a.policy.settings.owner_public_keys != b.policy.settings.owner_public_keys


async def test_the_lease_holder_writes_for_every_tenant_and_hands_all_of_them_over(
    running: Callable[..., Running],
) -> None:
    server = Server()
    first, second = running(server, "ctrl-a"), running(server, "ctrl-b")
    await eventually(lambda: first.working() or second.working())
    leader, follower = (first, second) if first.working() else (second, first)
    # Every tenant's workers run in the leader, none in the follower, which is ready all the
    # same (warm caches, both tenants synced).
    assert follower.idle() and not follower.fleet.leading
    await eventually(lambda: follower.fleet.synced)
    server.pod(A, "a-1", node="l40s-1")
    server.pod(B, "b-1", node="l40s-2")
    await eventually(lambda: len(server.kube.events) == 2)
    assert {e["reportingInstance"] for e in server.kube.events} == {leader.identity}
    await leader.close()
    # The Lease released on the way out: the follower leads both tenants at its next round,
    # and the old leader runs no tenant's workers.
    assert leader.idle()
    await eventually(follower.working, timeout=3)
    server.pod(A, "a-2", node="l40s-3")
    server.pod(B, "b-2", node="l40s-4")
    await eventually(lambda: server.verdict("a-2") == ("True", "Verified"))
    await eventually(lambda: server.verdict("b-2") == ("True", "Verified"))
    later = {e["regarding"]["name"]: e["reportingInstance"] for e in server.kube.events[2:]}
    assert later == {"a-2": follower.identity, "b-2": follower.identity}


async def test_losing_the_lease_stops_every_tenant_and_winning_it_back_starts_them(
    running: Callable[..., Running],
) -> None:
    server = Server()
    instance = running(server)
    await eventually(instance.working)
    # The API server refuses the Lease renewals: the holder's renew deadline passes and it
    # stops writing, for every tenant at once.
    server.kube.forbidden.add("replace_lease")
    await eventually(instance.idle, timeout=3)
    assert not instance.fleet.leading
    assert instance.fleet.controllers[0].metrics.is_leader._value.get() == 0
    server.pod(B, "b-1")
    before = len(server.kube.patches)
    # Renewals allowed again: it takes the Lease back, and each tenant starts over, queueing
    # every Pod it holds (the one that arrived meanwhile included).
    server.kube.forbidden.discard("replace_lease")
    await eventually(instance.working, timeout=3)
    await eventually(lambda: server.verdict("b-1") == ("True", "Verified"))
    assert len(server.kube.patches) == before + 1


async def test_a_neighbours_pod_arriving_and_leaving_rechecks_this_tenants_pods_on_its_node(
    running: Callable[..., Running],
) -> None:
    server = Server()
    server.pod(A, "a-1", node="l40s-1")
    server.pod(B, "b-1", node="l40s-1")
    server.pod(B, "b-2", node="l40s-2")
    running(server, leader_elect=False)
    await eventually(lambda: server.verdict("b-1") == ("False", "SharedWithAnotherTenant"))
    await eventually(lambda: server.verdict("a-1") == ("False", "SharedWithAnotherTenant"))
    await eventually(lambda: server.verdict("b-2") == ("True", "Verified"))
    # One Pod watch per tenant namespace in all: the neighbours' Pods come from the other
    # tenant's own informer, not from a watch of their own.
    assert server.pod_watches() == [A, B]
    # Team-a's Pod leaves the node: team-b's there is checked again at once, and verified.
    server.kube.delete("pods", "a-1")
    await eventually(lambda: server.verdict("b-1") == ("True", "Verified"))
    # Another of team-a's shares arrives on the node: the verified Pod keeps its verdict and
    # says why; the new one, which came second, is reported.
    server.pod(A, "a-2", node="l40s-1")
    await eventually(lambda: server.verdict("b-1") == ("True", "VerifiedSharedWithAnotherTenant"))
    await eventually(lambda: server.verdict("a-2") == ("False", "SharedWithAnotherTenant"))
    assert server.verdict("b-2") == ("True", "Verified")


async def test_a_neighbours_pod_kept_as_a_skeleton_still_holds_its_share(
    running: Callable[..., Running],
) -> None:
    """A Pod past the size the controller keeps is cut to a skeleton, which keeps no
    containers; what it holds on its node is kept beside it, so its size does not hide its
    share from the other tenants' checks."""
    server = Server()
    server.pod(A, "a-big", node="l40s-1", padding="x" * (MAX_KEPT_POD_BYTES + 1))
    server.pod(B, "b-1", node="l40s-1")
    running(server, leader_elect=False)
    await eventually(lambda: server.verdict("a-big") is not None)
    status, reason = server.verdict("a-big") or ("", "")
    assert status == "False" and reason != "SharedWithAnotherTenant"
    await eventually(lambda: server.verdict("b-1") == ("False", "SharedWithAnotherTenant"))


async def test_one_metrics_registry_and_probes_that_answer_for_every_tenant(
    running: Callable[..., Running],
) -> None:
    server = Server()
    server.pod(A, "a-1", node="l40s-1")
    server.pod(B, "b-1", node="l40s-2")
    instance = running(server, evidence_token="t0ken")
    client = TestClient(TestServer(create_app(instance.fleet)))
    await client.start_server()
    try:
        await eventually(lambda: server.verdict("b-1") == ("True", "Verified"))
        text = await (await client.get("/metrics")).text()
        # Each series once, the tenants' figures summed.
        assert 'tmi_allocation_verdicts_total{reason="Verified",status="True"} 2.0' in text
        assert 'tmi_allocation_profile_revisions{state="verified"} 2.0' in text
        assert 'tmi_allocation_profile_revisions_refused_total{reason="too-large"} 0.0' in text
        assert text.count("# TYPE tmi_allocation_queue_depth gauge") == 1
        assert "tmi_allocation_is_leader 1.0" in text
        ready = await client.get("/readyz")
        assert (ready.status, await ready.text()) == (200, "ok (leader)\n")
        assert (await client.get("/healthz")).status == 200
        # Team-b takes the controller's rights away: still ready, and the answer names team-b.
        server.ports[B].forbidden.update({"list_pods", "watch_pods", "patch_pod_status"})

        async def lacking() -> str | None:
            answer = await (await client.get("/readyz")).text()
            return answer if "may not" in answer else None

        answer = await polling.eventually_async(lacking, what="/readyz to name team-b")
        assert answer.startswith("ok (leader); ") and f"'{B}'" in answer and f"'{A}'" not in answer
        text = await (await client.get("/metrics")).text()
        rights = 'tmi_allocation_rights_missing{namespace="%s",resource="pods/status",verb="patch"}'
        assert rights % B + " 1.0" in text and rights % A + " 0.0" in text
        await instance.close()
        # Stopped, its loops are over: no longer alive.
        assert (await client.get("/healthz")).status == 503
    finally:
        await client.close()


async def test_a_fleet_of_one_is_the_single_tenant_process(
    running: Callable[..., Running],
) -> None:
    """Without --tenants: one tenant, its neighbours followed by its own informers
    (TMI_TENANT_NAMESPACES), the Lease as before."""
    server = Server()
    server.pod(A, "a-1", node="l40s-1")
    server.pod(B, "b-1", node="l40s-1")
    only = server.owners[B].settings(namespace=B)
    instance = running(server, policy=only, tenants=(), other_tenants=(A,))
    (controller,) = instance.fleet.controllers
    assert controller.namespace == B and controller.commons is None
    await eventually(lambda: server.verdict("b-1") == ("False", "SharedWithAnotherTenant"))
    # Team-a's Pods are followed by team-b's controller itself: no verdict is written there.
    assert server.verdict("a-1") is None
    assert server.pod_watches() == [A, B]
    (lease,) = server.kube.objects["leases"].values()
    assert lease["spec"]["holderIdentity"] == instance.identity


def test_the_fleet_needs_a_port_per_tenant_in_order() -> None:
    server = Server()
    settings = server.settings()
    with pytest.raises(ValueError, match="one port per tenant"):
        Fleet([server.ports[B], server.ports[A]], settings, lease=server.kube)
    with pytest.raises(ValueError, match="one port per tenant"):
        Fleet([server.ports[A]], settings, lease=server.kube)
