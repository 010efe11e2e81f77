"""Seed 002's lab, end to end: two tenants, two owner keys, GPU nodes shared between them.

One owner release (one scheduler, one extender, one allocation controller) serves two tenant
namespaces, each installed by its own namespace admin with a profile signed by its own owner
key; two KWOK GPU nodes of two 80 GiB GPUs each carry the VRAM plugin's per-GPU shares. Acting
as each tenant through the real API server and the real scheduler, the lab shows what seed 002
asks a platform to show rather than "Pods in Running state":

- each tenant's accounted shares sit on physical GPUs of its own (an accounted share does not
  isolate tenants, so no GPU holds two tenants' shares);
- each tenant's quota holds (the owner's `tmi-quota`, refused at create with the quota named);
- one tenant's burst neither evicts nor delays the other's placed Pods: they keep their node and
  their verdict, and a Pod the other tenant creates during the burst is placed and verified
  while the burst's Pods still queue;
- the evidence, per tenant and physical GPU UUID (`inference_policy.evidence.judge`, what
  `tmi evidence` reports on each host), holds every share to its grant with one tenant per card.

KWOK nodes have no GPUs, so the one simulated part is the host's process table that
`tmi evidence` would read: one process per placed Pod, on the GPU its plan's resource names
(`kamiwaza.ai/vram-gb-gpu-<i>`), within its grant. Everything it is judged against (the Pods,
their plans, their nodes) is read from the API server.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from chart_tools.render import find
from inference_policy.base.quantity import GI
from inference_policy.evidence import judge
from inference_policy.evidence.observations import (
    GpuDevice,
    GpuProcess,
    Observation,
    ProcessOwner,
    Sample,
)
from localcluster import ApiError, ControlPlane, FakeNode, Kube, create_fake_nodes
from localcluster.install.install import render_owner
from localcluster.install.stack import CONDITION, TenantStack, condition, deploy_stack, engine_pod
from localcluster.install.tenants import FurtherTenant, add_tenant
from localcluster.nodes.kwok import delete_fake_nodes
from tests.e2e.shareskit import VRAM, Tenant, create_once_planned, new_tenant, share, verified

pytestmark = pytest.mark.e2e

QUOTA = "tmi-quota"
# Tenant A may hold 40 GB of accounted VRAM in at most 3 engine Pods; tenant B 200 GB in 8.
QUOTAS = (
    {"accountedVramGB": 40, "enginePods": 3},
    {"accountedVramGB": 200, "enginePods": 8},
)


@dataclass
class Lab:
    stack: TenantStack
    a: Tenant
    b: Tenant
    nodes: tuple[str, str]


def _apply_quotas(admin: Kube, stack: TenantStack, tenants: tuple[Tenant, Tenant]) -> None:
    """The owner's upgrade with a quota per tenant (owner.quota, owner.tenants[].quota): the
    chart's own ResourceQuota objects, applied as the owner's Helm would."""
    values = stack.values()
    values["owner"]["quota"] = QUOTAS[0]
    values["owner"]["tenants"][0]["quota"] = QUOTAS[1]
    owner = render_owner(values, stack.settings.scheduler_namespace)
    for tenant in tenants:
        admin.apply(find(owner.docs, "ResourceQuota", QUOTA, tenant.namespace))


@pytest.fixture(scope="module")
def lab(control_plane: ControlPlane) -> Iterator[Lab]:
    admin = control_plane.kube("admin")
    suffix = uuid.uuid4().hex[:4]
    nodes = (f"lab-h100-{suffix}-1", f"lab-h100-{suffix}-2")
    a, b = new_tenant("tmi-lab-a"), new_tenant("tmi-lab-b")
    with deploy_stack(control_plane, a.settings, a.profile) as stack:
        control_plane.grant_namespace_admin("tmi-installer", a.namespace)
        second: FurtherTenant = add_tenant(stack, b.settings, b.profile)
        create_fake_nodes(admin, [FakeNode(n, gpus=2, vram_gb=80, vram_budget=True) for n in nodes])
        try:
            _apply_quotas(admin, stack, (a, b))
            assert stack.extender is not None
            stack.extender.wait_nodes(list(nodes))
            yield Lab(stack, a, b, nodes)
        finally:
            delete_fake_nodes(admin, list(nodes))
            second.stop()


def _gpu(pod: dict[str, Any]) -> tuple[str, int]:
    """The physical GPU a placed share sits on: its node and the index its resource names."""
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    (resource,) = [r for r in limits if r.startswith(VRAM)]
    return str(pod["spec"]["nodeName"]), int(resource.removeprefix(VRAM))


def _share_gb(pod: dict[str, Any]) -> int:
    """The accounted VRAM a placed share holds, in the plugin's GB."""
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    return sum(int(v) for r, v in limits.items() if r.startswith(VRAM))


def _engine_pods(admin: Kube, namespace: str) -> list[dict[str, Any]]:
    listed = admin.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/pods",
        query={"labelSelector": "kamiwaza.ai/deployment-id"},
    )
    return list(listed["items"])


def _holders(admin: Kube, lab: Lab) -> dict[tuple[str, int], set[str]]:
    """Each physical GPU that holds a placed share, with the tenants holding one there."""
    held: dict[tuple[str, int], set[str]] = {}
    for tenant in (lab.a, lab.b):
        for pod in _engine_pods(admin, tenant.namespace):
            if pod["spec"].get("nodeName"):
                held.setdefault(_gpu(pod), set()).add(tenant.namespace)
    return held


def _create(installer: Kube, tenant: Tenant, memory: str) -> str:
    name = f"{tenant.namespace.split('-')[2]}-{uuid.uuid4().hex[:6]}"
    installer.create(engine_pod(tenant.namespace, share(memory), name=name))
    return name


def _create_placeable(
    admin: Kube, installer: Kube, lab: Lab, tenant: Tenant, memory: str, *, own: bool = False
) -> str:
    """Create a share once the tenant's webhook plans it on a GPU index it can be placed on:
    one where some node's GPU holds no other tenant's share (`own`: holds one of this
    tenant's already, which no other tenant can take while the other's burst is placed).

    A share's plan names one GPU index (`kamiwaza.ai/vram-gb-gpu-<i>`), chosen by the room
    figures the owner's extender publishes every few seconds. Created on figures from before
    the other tenant's last share was placed, a Pod can be planned on an index where the other
    tenant now holds every node's GPU, and stays Pending by design
    (`tests/e2e/tenants/test_tenant_shares.py` covers that refusal). The figures' delay is not
    what this lab shows, so each Pod waits for its webhook to see them."""

    def usable(plan: dict[str, Any]) -> bool:
        held = _holders(admin, lab)
        index = int(str(plan["bindingId"]).removeprefix("share-gpu"))
        return any(
            held.get((node, index)) == {tenant.namespace}
            or (not own and not held.get((node, index)))
            for node in lab.nodes
        )

    prefix = tenant.namespace.split("-")[2]
    return create_once_planned(
        installer, tenant.namespace, prefix, share(memory), usable, "a usable GPU"
    )


def _refused(installer: Kube, tenant: Tenant, memory: str) -> str:
    pod = engine_pod(tenant.namespace, share(memory), name=f"over-{uuid.uuid4().hex[:6]}")
    with pytest.raises(ApiError) as refused:
        installer.create(pod)
    return refused.value.message


def _evidence(admin: Kube, lab: Lab, node: str) -> dict[str, Any]:
    """`tmi evidence` for one node: the Pods and plans from the API server, the process table
    simulated (one process per placed Pod, on its GPU, using 1 GiB of its grant)."""
    pods = [
        p
        for t in (lab.a, lab.b)
        for p in _engine_pods(admin, t.namespace)
        if p["spec"].get("nodeName") == node
    ]
    devices = tuple(
        GpuDevice(uuid=f"GPU-{node}-{i}", index=i, name="NVIDIA H100", memory_total_bytes=80 * GI)
        for i in (0, 1)
    )
    processes = tuple(
        GpuProcess(pid=1000 + n, gpu_uuid=f"GPU-{node}-{_gpu(pod)[1]}", used_bytes=GI)
        for n, pod in enumerate(pods)
    )
    owners = {1000 + n: ProcessOwner(pod_uid=pod["metadata"]["uid"]) for n, pod in enumerate(pods)}
    observation = Observation(
        "lab", "570.0", devices, (Sample(0, "2026-12-06T00:00:00Z", processes),)
    )
    return judge(observation, owners, pods, node=node)


def test_each_tenant_on_its_own_gpus_within_its_quota_undisturbed_by_the_others_burst(
    control_plane: ControlPlane, lab: Lab
) -> None:
    admin = control_plane.kube("admin")
    installer = control_plane.kube("tmi-installer")
    a, b = lab.a, lab.b
    # The quotas name no device count (shares are not a native quota's): nothing for the API
    # server's quota controller to count first; the webhook and the extender hold them.
    for tenant in (a, b):
        quota = admin.get("v1", "ResourceQuota", QUOTA, tenant.namespace)
        assert "tmi.kamiwaza.ai/quota" in quota["metadata"]["annotations"]

    # Each tenant places two shares; no physical GPU holds both tenants'.
    before = {}
    for _ in range(2):
        name = _create_placeable(admin, installer, lab, a, "16Gi")
        before[name] = verified(admin, a.namespace, name)
    for _ in range(2):
        verified(admin, b.namespace, _create_placeable(admin, installer, lab, b, "16Gi"))
    held = _holders(admin, lab)
    assert all(len(tenants) == 1 for tenants in held.values()), held

    # Tenant A's quota holds: a third 16 GiB share would hold 48 GB of its 40.
    message = _refused(installer, a, "16Gi")
    assert "tenant-mode inference (quota-exceeded): " in message, message
    assert f"quota {QUOTA}" in message, message

    # Tenant B bursts: six 30 GiB shares at once, past its quota and past the room it has. Its
    # webhook refuses what it sees past the quota; one racing the webhook's watch of the Pods
    # just created passes it and is held Pending by the owner's extender instead.
    burst: list[str] = []
    for _ in range(6):
        try:
            burst.append(_create(installer, b, "30Gi"))
        except ApiError as exc:
            assert "quota-exceeded" in exc.message, exc.message
    # Tenant A's Pod created in the middle of it is placed and verified, on A's own GPUs.
    during = _create_placeable(admin, installer, lab, a, "8Gi", own=True)
    pod = verified(admin, a.namespace, during)
    assert {a.namespace} == _holders(admin, lab)[_gpu(pod)]

    # A's placed Pods were neither evicted nor moved, and keep their verdict.
    for name, earlier in before.items():
        now = admin.get("v1", "Pod", name, a.namespace)
        assert now["metadata"]["uid"] == earlier["metadata"]["uid"]
        assert "deletionTimestamp" not in now["metadata"]
        assert now["spec"]["nodeName"] == earlier["spec"]["nodeName"]
        assert (condition(now, CONDITION) or {}).get("status") == "True"
        assert condition(now, "DisruptionTarget") is None
    held = _holders(admin, lab)
    assert all(len(tenants) == 1 for tenants in held.values()), held
    # B's quota held: what B's placed Pods hold stays within it, whatever passed its webhook.
    placed_b = [p for p in _engine_pods(admin, b.namespace) if p["spec"].get("nodeName")]
    assert len(placed_b) <= QUOTAS[1]["enginePods"]
    assert sum(_share_gb(p) for p in placed_b) <= QUOTAS[1]["accountedVramGB"]

    # The evidence per physical GPU: one tenant per card, every share within its grant.
    seen: dict[str, set[str]] = {}
    for node in lab.nodes:
        report = _evidence(admin, lab, node)
        assert report["verdict"]["status"] == "honoured", report["verdict"]
        for gpu in report["gpus"]:
            assert len(gpu["tenants"]) <= 1, gpu
            for holder in gpu["pods"]:
                seen.setdefault(holder["namespace"], set()).add(gpu["uuid"])
    assert seen[a.namespace] and seen[b.namespace]
    assert not seen[a.namespace] & seen[b.namespace]
    for name in burst:
        admin.delete("v1", "Pod", name, b.namespace, grace_period_seconds=0)
