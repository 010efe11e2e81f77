"""The guard that keeps the tenant-input inventory true: no owner part reads a Pod field it does
not list, nor one it says is never read.

Representative Pods (an engine Pod of every plan path, Pending and bound; one changed after its
plan in every way the checks look at; plans that place nothing or grant no device while they
reach; plain Pods, reaching or pinned to a node; Pods with status, terminating, finished, their
label removed, in no tenant's namespace), each carrying the fields no owner part should read
(affinity, tolerations, priority, volumes, probes, owner references, other labels and
annotations ...), are run through the owner parts' decision paths wrapped so that every key
path read is recorded (`tests.recording`): the extender's filter and prioritize in both wire
modes and its Pod informer callbacks (the ledger's accounting, the replica spread), the
allocation controller's watch handler, reconcile (the grant check, the DRA allocation, the
scheduling deadline) and departed-Pod reconcile, and the evidence readers. The admission
policies' CEL is read for every `object.` path it names. Every path read must be listed by the
inventory (`inference_policy.tools.tenant_inputs.listed`), and none may fall only under rows that
say "never read".
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, cast

import pytest

from allocation_controller.config import ControllerSettings
from allocation_controller.controller import Controller
from allocation_controller.leader import LeaderSettings
from allocation_controller.ports import JSON
from allocation_controller.reconciler import Reconciler, ReconcileSettings
from allocation_controller.revisions import PolicyView
from extender.verbs import filter_nodes, prioritize_nodes
from extender.view import ClusterView
from extender.wire import ExtenderArgs
from inference_policy.admission.policy_cel import policy_parts
from inference_policy.evidence.observations import pod_info
from inference_policy.evidence.pressure import classify_job_pod
from inference_policy.placing.ledger import UsageLedger, accounted_pod, holding_part, pod_key
from inference_policy.placing.spread import deployment_of
from inference_policy.tools import tenant_inputs
from inference_policy.trust.dra_claims import CLAIM_NAME
from kits.controllerkit import MemoryKube, merge_status_patch
from kits.extenderkit import (
    NAMESPACE,
    cache_args,
    fleet_envelope,
    full_args,
    published,
)
from kits.fleetkit import FLEET
from kits.memory_sources import ExtenderMemorySource
from kits.profilekit import NOW, Owner, dra_binding, gpu_profile
from localcluster.nodes.dra_driver import resource_slice
from serving.watched import Delta
from tests.recording import Reads, passing_through, recorded
from tests.tenantpods import DRA_BINDING, corpus


@pytest.fixture(scope="module")
def owner() -> Owner:
    return Owner()


@pytest.fixture(scope="module")
def envelope(owner: Owner) -> dict[str, Any]:
    envelope = fleet_envelope(owner)
    envelope["profiles"].append(
        gpu_profile("nvidia-dra", "whole-device", [dra_binding(DRA_BINDING)])
    )
    return envelope


@pytest.fixture(scope="module")
def pods(owner: Owner, envelope: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return corpus(owner, envelope)


# -- the owner parts, recorded ------------------------------------------------------------------


async def extender_reads(
    owner: Owner, envelope: dict[str, Any], pods: Mapping[str, dict[str, Any]], reads: Reads
) -> None:
    """Filter and prioritize in both wire modes, and the Pod informer's callbacks."""
    view = ClusterView(owner.settings(), [NAMESPACE], lambda: NOW)
    nodes = [node.manifest() for node in FLEET]
    source = ExtenderMemorySource(nodes, (), published(owner.sign(envelope)))
    await source.start(view)
    assert view.ready, view.pending
    names = [str(node["metadata"]["name"]) for node in nodes]
    for pod in pods.values():
        for args in (cache_args, lambda p, _: full_args(p, nodes)):
            body = cast(ExtenderArgs, args(recorded(pod, reads), names))
            filter_nodes(view, body)
            prioritize_nodes(view, body)
            view._demands.clear()
        part = holding_part(recorded(pod, reads))
        view.pod_changed(pod_key(part), accounted_pod(part), deployment_of(part))
        whole = recorded(pod, reads)
        view.pod_changed(pod_key(whole), accounted_pod(whole), deployment_of(whole))
        UsageLedger().apply(pod_key(whole), recorded(pod, reads))


class RecordingPort:
    """The reconciler's Pod port over a dict of Pods, handing each out recorded."""

    def __init__(self, pods: Mapping[str, dict[str, Any]], reads: Reads) -> None:
        self.pods = {name: copy.deepcopy(pod) for name, pod in pods.items()}
        self.reads = reads

    @property
    def namespace(self) -> str:
        return NAMESPACE

    async def get_pod(self, name: str, *, fresh: bool = False) -> JSON | None:
        pod = self.pods.get(name)
        return None if pod is None else cast(JSON, recorded(copy.deepcopy(pod), self.reads))

    async def list_pods(self, label_selector: str) -> list[JSON]:
        return []

    async def patch_pod_status(self, name: str, patch: Mapping[str, Any]) -> JSON:
        self.pods[name] = merge_status_patch(self.pods[name], patch)
        return cast(JSON, recorded(copy.deepcopy(self.pods[name]), self.reads))

    async def create_event(self, event: Mapping[str, Any]) -> None:
        return None


class Claims:
    """The DRA Pod's claim, allocated a device of its binding on its node."""

    async def get_resource_claim(self, name: str) -> JSON | None:
        result = {
            "request": f"{CLAIM_NAME}/b0",
            "driver": "gpu.nvidia.com",
            "pool": "h100-8",
            "device": "gpu-0",
        }
        return {
            "metadata": {"name": name},
            "status": {"allocation": {"devices": {"results": [result]}}},
        }

    async def list_resource_slices(self, node: str) -> list[JSON]:
        from localcluster.nodes.dra_driver import published_device

        return [resource_slice(node, [published_device("gpu-0")])]


async def controller_reads(
    owner: Owner, envelope: dict[str, Any], pods: Mapping[str, dict[str, Any]], reads: Reads
) -> None:
    """The watch handler, reconcile of every Pod and of a departed one."""
    policy = PolicyView(owner.settings())
    policy.apply_configmap(published(owner.sign(envelope, name="kamiwaza-inference-profiles")))
    port = RecordingPort(pods, reads)
    reconciler = Reconciler(
        port, policy, ReconcileSettings(scheduling_timeout=60), clock=lambda: NOW, claims=Claims()
    )
    for name in pods:
        await reconciler.reconcile(name)
    await reconciler.reconcile_departed("departed", str(pods["departed"]["metadata"]["uid"]))
    settings = ControllerSettings(
        policy=owner.settings(),
        leader=LeaderSettings(name="tmi-allocation-controller", identity="ctrl-0"),
    )
    controller = Controller(MemoryKube(NAMESPACE), settings, clock=lambda: NOW)
    for pod in pods.values():
        old = recorded(pod, reads)
        controller._on_pod(Delta("ADDED", recorded(pod, reads), None, listed=False))
        controller._on_pod(Delta("MODIFIED", recorded(pod, reads), old, listed=False))
        controller._on_pod(Delta("DELETED", recorded(pod, reads), old, listed=False))


def evidence_reads(pods: Mapping[str, dict[str, Any]], reads: Reads) -> None:
    for pod in pods.values():
        pod_info(recorded(pod, reads))
        classify_job_pod(recorded(pod, reads), container="engine")


@pytest.fixture
def everything_read(
    owner: Owner,
    envelope: dict[str, Any],
    pods: dict[str, dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[], Any]:
    async def run() -> Reads:
        reads = Reads()
        with passing_through(monkeypatch):
            await extender_reads(owner, envelope, pods, reads)
            await controller_reads(owner, envelope, pods, reads)
            evidence_reads(pods, reads)
        return reads

    return run


# -- the verdicts -------------------------------------------------------------------------------


def unlisted(reads: Reads) -> list[str]:
    """Paths read that no row lists (an object or list only handed out, or its size asked,
    counts as listed when a row lists something under it)."""
    out = []
    for path, kinds in reads:
        container = kinds <= {"container", "absent"}
        if not tenant_inputs.listed(path, container=container):
            out.append(f"{path} ({', '.join(sorted(kinds))})")
    return out


def read_though_never_read(reads: Reads) -> list[str]:
    """Paths read that fall only under rows saying the input is never read."""
    out = []
    for path, _ in reads:
        rows = tenant_inputs.listed(path)
        if rows and all(row.treatment == "never read" for row in rows):
            out.append(f"{path}: {rows[0].paths}")
    return out


async def test_no_owner_part_reads_a_pod_field_the_inventory_does_not_list(
    everything_read: Callable[[], Any],
) -> None:
    reads = await everything_read()
    assert len(reads.paths) > 60, sorted(reads.paths)
    assert unlisted(reads) == [], "read, not in inventory.tenant_inputs: " + "; ".join(
        unlisted(reads)
    )


async def test_no_owner_part_reads_what_the_inventory_says_is_never_read(
    everything_read: Callable[[], Any],
) -> None:
    reads = await everything_read()
    assert read_though_never_read(reads) == []


async def test_the_recorder_sees_the_reads_that_matter(
    everything_read: Callable[[], Any],
) -> None:
    """The recording reaches where the decisions are made: the plan, the request, the engine
    container's image and asks, device variables, the CDI scan, the phase, the verdict, the
    engine label, the claim's name."""
    reads = await everything_read()
    for path in (
        "metadata.annotations[kamiwaza.ai/plan]",
        "metadata.annotations[kamiwaza.ai/deployment-request]",
        "metadata.annotations[kamiwaza.ai/engine-container]",
        "metadata.annotations[*]",
        "metadata.labels[kamiwaza.ai/deployment-id]",
        "metadata.deletionTimestamp",
        "metadata.creationTimestamp",
        "spec.containers[].image",
        "spec.containers[].resources.limits[nvidia.com/gpu]",
        "spec.containers[].env[].name",
        "spec.containers[].envFrom",
        "spec.initContainers[].restartPolicy",
        "spec.runtimeClassName",
        "spec.nodeSelector[kubernetes.io/arch]",
        "spec.nodeName",
        "spec.resourceClaims",
        "spec.overhead.cpu",
        "status.phase",
        "status.conditions[].type",
        "status.resourceClaimStatuses",
        "status.containerStatuses[].containerID",
    ):
        assert path in reads.paths, path
    for path in ("spec.affinity", "spec.priorityClassName", "metadata.ownerReferences"):
        assert not any(read.startswith(path) for read in reads.paths), path


# -- the admission policies ---------------------------------------------------------------------

CEL_PATH = re.compile(r"\b(?:object|oldObject)\.((?:metadata|spec|status)(?:\.[A-Za-z]+)*)")
CEL_KEY = re.compile(r"\b(?:object|oldObject)\.metadata\.(labels|annotations)\[\s*'([^']+)'\s*\]")
CEL_METHODS = frozenset(("exists", "all", "filter", "map", "startsWith", "contains", "join"))
CEL_IN = re.compile(r"'([^']+)' in (?:object|oldObject)\.metadata\.(labels|annotations)\b")


def cel_paths() -> set[str]:
    """Every Pod path the shield, guard, verdict and status policies name (`object.` and
    `oldObject.`; what their macros read of each container is the Python predicate's, which the
    same tables generate and the recording above covers)."""
    parts = policy_parts()
    text = json.dumps([parts[k] for k in ("shield", "guard", "verdict", "status")])
    text = text.replace('\\"', '"')
    found = set()
    for path in CEL_PATH.findall(text):
        kept = []
        for part in path.split("."):
            if part in CEL_METHODS:
                break
            kept.append(part)
        found.add(".".join(kept))
    found |= {f"metadata.{kind}[{key}]" for kind, key in CEL_KEY.findall(text)}
    found |= {f"metadata.{kind}[{key}]" for key, kind in CEL_IN.findall(text)}
    return found


def test_the_policies_name_no_pod_field_the_inventory_does_not_list() -> None:
    found = cel_paths()
    assert {"spec.containers", "status.phase", "metadata.annotations[kamiwaza.ai/plan]"} <= found
    missing = sorted(p for p in found if not tenant_inputs.listed(p, container=True))
    assert missing == []


def _holds(document: Any, parts: tuple[str, ...]) -> bool:
    if not parts:
        return True
    head, rest = parts[0], parts[1:]
    if head == "[]":
        return isinstance(document, list) and any(_holds(item, rest) for item in document)
    key = head[1:-1] if head.startswith("[") else head
    return isinstance(document, dict) and key in document and _holds(document[key], rest)


def test_the_pods_carry_every_field_the_inventory_says_is_never_read(
    pods: dict[str, dict[str, Any]],
) -> None:
    """So the recording above would see a read of any of them."""
    missing = [
        path
        for row in tenant_inputs.pod_rows()
        if row.treatment == "never read"
        for path in row.paths
        if "<" not in path
        and not any(_holds(pod, tenant_inputs.segments(path)) for pod in pods.values())
    ]
    assert missing == []
