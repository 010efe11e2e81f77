"""Engine Pods placed by the owner's second scheduler and the tmi extender, end to end.

The whole stack runs behind the real API server (``localcluster.install.stack``): the webhook plans
each Pod, kube-scheduler ``kamiwaza-inference-scheduler`` runs the configuration ``tmi
render-scheduler-config`` renders for the profile (the extender over HTTPS, not ignorable), the
extender judges KWOK nodes by their GPU Feature Discovery labels and its own accounting, and the
controller writes AllocationVerified. Pods are created by ``tmi-installer``, the namespace admin.

The profile is built for the fake fleet: a whole-H100 binding (compute capability 9.0, CUDA 13,
79Gi of an 80 GiB card, p2p for tensor parallelism) and an A100 ``3g.40gb`` MIG binding (8.0,
CUDA 13, 38Gi of a 40 GiB slice), so every refusal a test sees comes from the node the test made
contradict the binding, never from the fleet at large. Each test creates its own nodes and Pods
and removes them, so the module's tests do not depend on one another's leftovers.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from kits.fleetkit import a100_mig, h100
from kits.profilekit import Owner, gpu_binding, gpu_profile, request, with_profiles
from kits.stackkit import LARGE, WHOLE, dated, pod_names, tenant_stack, whole_h100_profile
from localcluster import ControlPlane, FakeNode, Kube, create_fake_nodes, wait_until
from localcluster.install.stack import CONDITION, TenantStack, condition, engine_pod, metric
from localcluster.nodes.kwok import delete_fake_nodes
from localcluster.servers.webhook import CONFIGURATION_NAME

pytestmark = pytest.mark.e2e

SCHEDULING_TIMEOUT = 5
MIG = "mig-3g40gb-amd64"
MIG_RESOURCE = "nvidia.com/mig-3g.40gb"
# qwen2.5-7B GGUF (4.7 GB): the smallest binding that holds it is the MIG slice.
SMALL = request("llamacpp")
# LARGE, a 72B GGUF at Q4 (47 GB), needs more than a 38Gi slice: a whole GPU.
TENSOR_PARALLEL = request("vllm", config__tensor_parallel_size=2)


def fleet_envelope(owner: Owner, namespace: str) -> dict[str, Any]:
    """The profile the fleet above satisfies, valid from yesterday for a month."""
    envelope = with_profiles(
        owner,
        whole_h100_profile(),
        gpu_profile(
            "nvidia-mig-3g40gb",
            "mig",
            [
                gpu_binding(
                    MIG, cc="8.0", memory="38Gi", resource=MIG_RESOURCE, features=["bf16", "mig"]
                )
            ],
        ),
    )
    return dated(envelope, namespace)


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane) -> Iterator[TenantStack]:
    with tenant_stack(control_plane, "tmi-place", fleet_envelope, SCHEDULING_TIMEOUT) as up:
        yield up


@pytest.fixture
def nodes(control_plane: ControlPlane, stack: TenantStack) -> Iterator[Callable[..., list[str]]]:
    """Creates nodes (unique names), waits until KWOK and the extender have them; deletes them."""
    kube = control_plane.kube("admin")
    created: list[str] = []
    suffix = uuid.uuid4().hex[:4]

    def make(*specs: FakeNode) -> list[str]:
        named = [replace(spec, name=f"{spec.name}-{suffix}") for spec in specs]
        created.extend(n.name for n in named)
        create_fake_nodes(kube, named)
        assert stack.extender is not None
        stack.extender.wait_nodes(n.name for n in named)
        return [n.name for n in named]

    yield make
    delete_fake_nodes(kube, created)


@pytest.fixture
def pods(control_plane: ControlPlane, stack: TenantStack) -> Iterator[Callable[..., str]]:
    """Creates engine Pods as the namespace admin; deletes them after the test."""
    installer = control_plane.kube("tmi-installer")
    with pod_names(control_plane, stack) as unique:

        def make(body: dict[str, Any], prefix: str = "tmi") -> str:
            name = unique(prefix)
            installer.create(engine_pod(stack.settings.namespace, body, name=name))
            return name

        yield make


def _ns(stack: TenantStack) -> str:
    return stack.settings.namespace


def bound(kube: Kube, stack: TenantStack, name: str, timeout: float = 60) -> dict[str, Any]:
    return kube.wait_for(
        "v1",
        "Pod",
        name,
        _ns(stack),
        lambda p: bool(p["spec"].get("nodeName")),
        timeout=timeout,
        what=f"Pod {name} to be bound",
    )


def verdict(
    kube: Kube, stack: TenantStack, name: str, status: str, timeout: float = 60
) -> dict[str, Any]:
    """The Pod once its AllocationVerified condition reads ``status``; returns the condition."""
    pod = kube.wait_for(
        "v1",
        "Pod",
        name,
        _ns(stack),
        lambda p: (condition(p, CONDITION) or {}).get("status") == status,
        timeout=timeout,
        what=f"Pod {name} AllocationVerified={status}",
    )
    found = condition(pod, CONDITION)
    assert found is not None
    return found


def plan_of(pod: dict[str, Any]) -> dict[str, Any]:
    plan: dict[str, Any] = json.loads(pod["metadata"]["annotations"]["kamiwaza.ai/plan"])
    return plan


def limits(pod: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = pod["spec"]["containers"][0]["resources"].get("limits") or {}
    return found


def scheduled_message(pod: dict[str, Any]) -> str:
    return str((condition(pod, "PodScheduled") or {}).get("message", ""))


def filter_calls(stack: TenantStack) -> float:
    assert stack.extender is not None
    return metric(stack.extender.metrics(), "tmi_extender_requests_total", verb="filter")


def test_mig_sized_model_lands_on_the_mig_slice_and_a_large_one_on_a_whole_gpu(
    kube: Kube, stack: TenantStack, nodes: Callable[..., list[str]], pods: Callable[..., str]
) -> None:
    mig_node, whole_node = nodes(a100_mig("a100-mig", gpus=1, slices=2), h100("h100", gpus=1))
    before = filter_calls(stack)
    small, large = pods(SMALL, "small"), pods(LARGE, "large")

    small_pod, large_pod = bound(kube, stack, small), bound(kube, stack, large)
    assert (small_pod["spec"]["nodeName"], plan_of(small_pod)["bindingId"]) == (mig_node, MIG)
    assert limits(small_pod) == {MIG_RESOURCE: "1"}
    assert (large_pod["spec"]["nodeName"], plan_of(large_pod)["bindingId"]) == (whole_node, WHOLE)
    assert limits(large_pod) == {"nvidia.com/gpu": "1"}
    for pod in (small_pod, large_pod):
        assert pod["spec"]["schedulerName"] == stack.settings.scheduler_name
        assert pod["spec"]["runtimeClassName"] == "nvidia"
    # The extender, not only the scheduler's resource fit, judged both Pods.
    assert filter_calls(stack) >= before + 2
    for name in (small, large):
        assert verdict(kube, stack, name, "True")["reason"] == "Verified"


def test_tensor_parallel_pod_gets_two_gpus_on_one_node(
    kube: Kube, stack: TenantStack, nodes: Callable[..., list[str]], pods: Callable[..., str]
) -> None:
    _, _, pair = nodes(h100("single-a", gpus=1), h100("single-b", gpus=1), h100("pair", gpus=2))
    name = pods(TENSOR_PARALLEL, "tp")

    pod = bound(kube, stack, name)
    plan = plan_of(pod)
    assert pod["spec"]["nodeName"] == pair
    assert limits(pod) == {"nvidia.com/gpu": "2"}
    assert (plan["bindingId"], plan["deviceCount"]) == (WHOLE, 2)
    assert plan["engineArgs"]["tensor_parallel_size"] == 2
    assert verdict(kube, stack, name, "True")["reason"] == "Verified"


def test_best_fit_fills_the_partly_used_node_and_leaves_the_emptier_one_whole(
    kube: Kube, stack: TenantStack, nodes: Callable[..., list[str]], pods: Callable[..., str]
) -> None:
    """Two 2-GPU nodes, one already holding a Pod: a 1-GPU Pod goes to the fuller node, so the
    other stays whole and a tensor-parallel Pod that needs both of its GPUs still fits.

    The engine containers ask for no CPU or memory, so kube-scheduler's own scores are level
    between the nodes and the extender's best-fit score decides; spreading would leave no node
    with two free GPUs and the tensor-parallel Pod Pending.
    """
    (fuller,) = nodes(h100("fit-a", gpus=2))
    first = pods(LARGE, "first")
    assert bound(kube, stack, first)["spec"]["nodeName"] == fuller

    (emptier,) = nodes(h100("fit-b", gpus=2))
    second = pods(LARGE, "second")
    assert bound(kube, stack, second)["spec"]["nodeName"] == fuller

    wide = pods(TENSOR_PARALLEL, "wide")
    assert bound(kube, stack, wide)["spec"]["nodeName"] == emptier


def test_replicas_of_one_deployment_go_to_distinct_nodes_while_deployments_still_pack(
    control_plane: ControlPlane, kube: Kube, stack: TenantStack, nodes: Callable[..., list[str]]
) -> None:
    """Seed 002: two replicas on one GPU are no evidence of resilience to that GPU failing.
    A 2-GPU and a 4-GPU node: best fit sends the first replica to the smaller; the second
    replica of the same deployment would fill it exactly, and goes to the other node instead;
    a Pod of another deployment still fills the smaller node, through the real scheduler."""
    smaller, larger = nodes(h100("spread-a", gpus=2), h100("spread-b", gpus=4))
    installer = control_plane.kube("tmi-installer")
    with pod_names(control_plane, stack) as unique:

        def replica(deployment: str) -> str:
            name = unique(deployment)
            pod = engine_pod(_ns(stack), LARGE, name=name, deployment_id=deployment)
            installer.create(pod)
            return name

        extender = stack.extender
        assert extender is not None

        def placed(deployment: str) -> str:
            before = metric(extender.metrics(), "tmi_extender_accounted_pods")
            node = str(bound(kube, stack, replica(deployment))["spec"]["nodeName"])
            # The next Pod is judged with this one in the extender's ledger, as a later
            # replica of a rollout is.
            wait_until(
                lambda: metric(extender.metrics(), "tmi_extender_accounted_pods") > before,
                timeout=30,
                what="the extender to account the bound Pod",
            )
            return node

        chat = f"chat-{uuid.uuid4().hex[:4]}"
        assert placed(chat) == smaller
        assert placed(chat) == larger
        assert placed(f"embed-{chat}") == smaller


def test_node_whose_labels_contradict_the_binding_is_filtered_with_the_reason(
    kube: Kube, stack: TenantStack, nodes: Callable[..., list[str]], pods: Callable[..., str]
) -> None:
    """Both nodes advertise a free nvidia.com/gpu, so kube-scheduler's own filters pass them;
    the extender refuses each with what GPU Feature Discovery says against the signed binding,
    and kube-scheduler reports those reasons on the Pod."""
    older_card, older_driver = nodes(
        FakeNode(
            "a100-whole", gpu_product="NVIDIA-A100-SXM4-80GB", vram_gb=80, compute_capability="8.0"
        ),
        h100(
            "h100-r570",
            gpus=1,
            cuda_driver_major=12,
            cuda_driver_minor=8,
            driver_version="570.86.15",
        ),
    )
    assert stack.extender is not None
    verdicts_before = stack.extender.metrics()
    name = pods(LARGE, "contradicted")

    pod = kube.wait_for(
        "v1",
        "Pod",
        name,
        _ns(stack),
        lambda p: "GPU Feature Discovery" in scheduled_message(p),
        timeout=60,
        what=f"Pod {name} to report the extender's reasons",
    )
    scheduled = condition(pod, "PodScheduled")
    assert scheduled is not None
    assert scheduled["status"] == "False"
    assert scheduled["reason"] == "Unschedulable"
    message = scheduled["message"]
    assert (
        "GPU Feature Discovery reports compute capability 8.0 "
        f"(nvidia.com/gpu.compute.major/nvidia.com/gpu.compute.minor); binding {WHOLE} attests 9.0"
    ) in message
    assert (
        "GPU Feature Discovery reports a driver for CUDA 12 "
        f"(nvidia.com/cuda.runtime-version.major); binding {WHOLE} attests cudaDriverMajor 13"
    ) in message
    assert not pod["spec"].get("nodeName")
    after = stack.extender.metrics()
    for code in ("compute-capability", "cuda-driver"):
        name_ = "tmi_extender_node_verdicts_total"
        assert metric(after, name_, code=code) > metric(verdicts_before, name_, code=code)

    # The same Pod lands as soon as a node that matches the attestation appears, and on it.
    (matching,) = nodes(h100("h100-r580", gpus=1))
    placed = bound(kube, stack, name)
    assert placed["spec"]["nodeName"] == matching
    assert placed["spec"]["nodeName"] not in (older_card, older_driver)


def test_full_cluster_leaves_the_pod_pending_with_reasons_then_reports_the_deadline(
    kube: Kube, stack: TenantStack, nodes: Callable[..., list[str]], pods: Callable[..., str]
) -> None:
    (node,) = nodes(h100("full", gpus=1))
    holder = pods(LARGE, "holder")
    bound(kube, stack, holder)
    waiting = pods(LARGE, "waiting")

    pod = kube.wait_for(
        "v1",
        "Pod",
        waiting,
        _ns(stack),
        lambda p: (condition(p, "PodScheduled") or {}).get("reason") == "Unschedulable",
        timeout=60,
    )
    scheduled = condition(pod, "PodScheduled")
    assert scheduled is not None
    assert "Insufficient nvidia.com/gpu" in scheduled["message"]
    assert pod["status"]["phase"] == "Pending"

    # The controller's deadline: the Pod says why it is not running, in the scheduler's words.
    deadline = verdict(kube, stack, waiting, "False", timeout=SCHEDULING_TIMEOUT + 30)
    assert deadline["reason"] == "SchedulingTimeout"
    assert f"not scheduled within {SCHEDULING_TIMEOUT}s of creation" in deadline["message"]
    assert "Insufficient nvidia.com/gpu" in deadline["message"]

    # Stopping the deployment that holds the GPU lets the waiting one run, verified.
    kube.delete("v1", "Pod", holder, _ns(stack), grace_period_seconds=0)
    assert bound(kube, stack, waiting)["spec"]["nodeName"] == node
    assert verdict(kube, stack, waiting, "True")["reason"] == "Verified"


def test_extender_restart_loses_nothing(
    kube: Kube, stack: TenantStack, nodes: Callable[..., list[str]], pods: Callable[..., str]
) -> None:
    """A Pod created while the extender is down waits (the extender is not ignorable) and is
    placed once it is back, by the accounting the new process rebuilt from the API.

    Three Pods fill three of four GPUs on one node before a second, empty 2-GPU node exists.
    With the earlier Pods counted, best fit sends the new Pod to the last free GPU of the first
    node (nothing left over beats one GPU left over); a restarted extender that had lost them
    would see three free GPUs there and choose the 2-GPU node instead.
    """
    extender = stack.extender
    assert extender is not None
    (busy,) = nodes(h100("acct-4", gpus=4))
    earlier = [pods(LARGE, "earlier") for _ in range(3)]
    for name in earlier:
        assert bound(kube, stack, name)["spec"]["nodeName"] == busy
    (spare,) = nodes(h100("acct-2", gpus=2))

    extender.stop()
    try:
        late = pods(LARGE, "late")
        pod = kube.wait_for(
            "v1",
            "Pod",
            late,
            _ns(stack),
            lambda p: (condition(p, "PodScheduled") or {}).get("reason") == "SchedulerError",
            timeout=30,
            what=f"the scheduler to report it cannot reach the extender for {late}",
        )
        assert f"{extender.url}/filter" in scheduled_message(pod)
        # Bounded negative check: nothing places a GPU Pod while its extender is unreachable.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert not kube.get("v1", "Pod", late, _ns(stack))["spec"].get("nodeName")
            time.sleep(0.5)
    finally:
        extender.start()

    placed = bound(kube, stack, late)
    assert placed["spec"]["nodeName"] == busy, f"placed on {placed['spec']['nodeName']}, not {busy}"
    assert spare != busy
    assert metric(extender.metrics(), "tmi_extender_accounted_pods") == 4
    assert verdict(kube, stack, late, "True")["reason"] == "Verified"


CPU_ENGINE = request(
    inferenceResources={
        "schemaVersion": 1,
        "cpu": {"architecture": "amd64", "requests": {"cpu": "4", "memory": "16Gi"}},
        "runtime": {"selection": "automatic"},
    }
)


def test_cpu_engine_lands_on_the_cpu_node_and_on_a_gpu_node_only_once_that_is_full(
    kube: Kube, stack: TenantStack, nodes: Callable[..., list[str]], pods: Callable[..., str]
) -> None:
    """The GPU node is the one kube-scheduler's own MostAllocated scoring prefers for a 4-core,
    16Gi engine (it would be 50% of its CPU and 80% of its memory, against 67% and 6% of the
    CPU node's); the extender scores GPU nodes 0 for a CPU Pod, so the CPU node wins. It has
    room for one such engine; the second goes to the GPU node, because steering is a score,
    not a filter."""
    gpu_node, cpu_node = nodes(
        h100("steer-gpu", gpus=1, cpu="8", memory="20Gi"),
        FakeNode("steer-cpu", gpus=0, vram_gb=None, cpu="6", memory="256Gi"),
    )
    extender = stack.extender
    assert extender is not None
    before = metric(extender.metrics(), "tmi_extender_requests_total", verb="prioritize")
    first = pods(CPU_ENGINE, "cpu-first")
    placed = bound(kube, stack, first)
    assert plan_of(placed)["path"] == "cpu"
    assert placed["spec"]["nodeName"] == cpu_node
    # The extender was consulted for the CPU Pod: no managedResources limit its calls.
    after = metric(extender.metrics(), "tmi_extender_requests_total", verb="prioritize")
    assert after > before

    second = pods(CPU_ENGINE, "cpu-second")
    assert bound(kube, stack, second)["spec"]["nodeName"] == gpu_node


def _as_submitted(stored: dict[str, Any]) -> dict[str, Any]:
    """A Pod the API server returned, as a client would send it again."""
    pod = copy.deepcopy(stored)
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"):
        pod["metadata"].pop(key, None)
    pod.pop("status", None)
    return pod


def test_a_replaced_webhook_granting_eight_gpus_gets_no_pod_bound(
    control_plane: ControlPlane,
    kube: Kube,
    stack: TenantStack,
    nodes: Callable[..., list[str]],
) -> None:
    """The tenant's namespace admin swaps its webhook for one that writes a plan of 8 GPUs for a
    request the signed profile plans 1 for, plan annotation, scheduler and shields all in the
    planned shape: the guard cannot tell it from a plan, so the owner's extender, which checks
    the Pod against the verified revision, passes no node, and the Pod stays unbound with the
    reason in its events. An 8-GPU node is free throughout."""
    nodes(h100("h100-8", gpus=8))
    installer = control_plane.kube("tmi-installer")
    namespace = _ns(stack)
    honest = installer.create(engine_pod(namespace, LARGE, name="honest"), dry_run=True)
    assert limits(honest) == {"nvidia.com/gpu": "1"}
    forged = _as_submitted(honest)
    forged["metadata"]["name"] = f"forged-{uuid.uuid4().hex[:6]}"
    plan = plan_of(forged)
    eight = {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}
    plan["resources"] = eight
    forged["metadata"]["annotations"]["kamiwaza.ai/plan"] = json.dumps(plan)
    forged["spec"]["containers"][0]["resources"] = eight
    with _webhook_removed(control_plane, stack, forged, json.dumps(plan)):
        installer.create(forged)
        pod = kube.wait_for(
            "v1",
            "Pod",
            forged["metadata"]["name"],
            namespace,
            lambda p: "plans for the Pod's deployment request" in scheduled_message(p),
            timeout=60,
            what="the scheduler to report the extender's grant check",
        )
        assert not pod["spec"].get("nodeName"), f"bound to {pod['spec'].get('nodeName')}"
        assert limits(pod) == {"nvidia.com/gpu": "8"}
        kube.delete("v1", "Pod", forged["metadata"]["name"], namespace)


@pytest.mark.parametrize(
    "asks",
    [{"nvidia.com/gpu": "2"}, {"aws.amazon.com/neuroncore": "2"}],
    ids=["two-gpus", "neuron-cores"],
)
def test_a_plan_that_says_it_places_nothing_gets_no_device(
    control_plane: ControlPlane,
    kube: Kube,
    stack: TenantStack,
    nodes: Callable[..., list[str]],
    asks: dict[str, str],
) -> None:
    """The tenant's namespace admin removes its webhook (its uninstall hook's identity may) and
    creates engine Pods whose plan's path is `external` (a plan that places nothing) while they
    hold two GPUs, or two Neuron cores no profile vouches for, scheduled by the owner's
    scheduler as the guard asks. The guard sees a plan on a grant-holding engine Pod; the
    owner's extender holds every Pod that reaches for anything to a GPU plan the signed profile
    grants (`inference_policy.admission.device_gate`), so no node passes and nothing is bound, with
    an 8-GPU node free throughout."""
    # The node advertises what the Pod asks for from its creation, so kube-scheduler's own fit
    # passes it and only the extender stands between the Pod and the device.
    nodes(replace(h100("h100-free", gpus=8), extra_resources={name: "8" for name in asks}))
    installer = control_plane.kube("tmi-installer")
    namespace = _ns(stack)
    honest = installer.create(engine_pod(namespace, LARGE, name="honest"), dry_run=True)
    forged = _as_submitted(honest)
    forged["metadata"]["name"] = f"external-{uuid.uuid4().hex[:6]}"
    external = {"status": 200, "path": "external", "derived": True, "engine": "llamacpp"}
    forged["metadata"]["annotations"]["kamiwaza.ai/plan"] = json.dumps(external)
    forged["spec"]["containers"][0]["resources"] = {"requests": asks, "limits": asks}
    with _webhook_removed(control_plane, stack, forged, json.dumps(external)):
        installer.create(forged)
        pod = kube.wait_for(
            "v1",
            "Pod",
            forged["metadata"]["name"],
            namespace,
            lambda p: "only a gpu plan the signed profile grants" in scheduled_message(p),
            timeout=60,
            what="the scheduler to report the extender's device gate",
        )
        assert not pod["spec"].get("nodeName"), f"bound to {pod['spec'].get('nodeName')}"
        assert limits(pod) == asks
        kube.delete("v1", "Pod", forged["metadata"]["name"], namespace)


@contextlib.contextmanager
def _webhook_removed(
    control_plane: ControlPlane, stack: TenantStack, probe: dict[str, Any], plan: str
) -> Iterator[None]:
    """The tenant's webhook configuration deleted (as its uninstall hook would) until the
    block ends, once a dry run of `probe` keeps its `plan`; then restored and planning again."""
    installer, admin = control_plane.kube("tmi-installer"), control_plane.kube("admin")
    probe = _as_submitted(probe)
    probe["metadata"]["name"] = f"probe-{uuid.uuid4().hex[:6]}"
    assert stack.owner is not None
    configuration = stack.owner.get("MutatingWebhookConfiguration", CONFIGURATION_NAME)
    admin.delete(
        "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", CONFIGURATION_NAME
    )
    try:
        wait_until(
            lambda: (
                installer.create(_as_submitted(probe), dry_run=True)["metadata"]["annotations"][
                    "kamiwaza.ai/plan"
                ]
                == plan
            ),
            timeout=60,
            what="engine Pods to stop being planned by the tenant webhook",
        )
        yield
    finally:
        admin.apply(configuration)
        wait_until(
            lambda: (
                installer.create(_as_submitted(probe), dry_run=True)["metadata"]["annotations"][
                    "kamiwaza.ai/plan"
                ]
                != plan
            ),
            timeout=60,
            what="the tenant webhook to plan engine Pods again",
        )


def test_a_profile_signed_with_the_tenants_own_key_places_nothing(
    control_plane: ControlPlane,
    kube: Kube,
    stack: TenantStack,
    nodes: Callable[..., list[str]],
) -> None:
    """The tenant's namespace admin signs a profile of its own (its key, its bindings) over the
    owner's ConfigMap and points its webhook's trust at its key. Its webhook plans under it; the
    owner's extender trusts only the owner's key from the owner's release, refuses that profile,
    and no node passes the Pod, with a free H100 waiting."""
    nodes(h100("h100-own-key", gpus=1))
    installer = control_plane.kube("tmi-installer")
    namespace = _ns(stack)
    webhook = stack.webhook
    assert webhook is not None
    name = stack.settings.bundle_configmap
    owners = installer.get("v1", "ConfigMap", name, namespace)
    tenant = Owner()
    forged = tenant.sign(fleet_envelope(tenant, namespace), name=name)
    honest_environment = webhook.settings.environment
    trusting_itself = {**dict(honest_environment), "TMI_OWNER_PUBLIC_KEY": tenant.public_key}
    pod_name = f"own-key-{uuid.uuid4().hex[:6]}"
    try:
        # The published ConfigMap is immutable: the tenant deletes it and creates its own.
        installer.delete("v1", "ConfigMap", name, namespace)
        installer.create(forged)
        webhook.restart(environment=tuple(trusting_itself.items()))
        planned = wait_until(
            lambda: _planned_under(installer, namespace, forged),
            timeout=60,
            what="the tenant's webhook to plan under the tenant's own profile",
        )
        assert planned
        installer.create(engine_pod(namespace, LARGE, name=pod_name))
        pod = kube.wait_for(
            "v1",
            "Pod",
            pod_name,
            namespace,
            lambda p: "invalid inference profile authorization" in scheduled_message(p),
            timeout=60,
            what="the scheduler to report the extender's refusal of the tenant's profile",
        )
        assert not pod["spec"].get("nodeName")
    finally:
        kube.delete("v1", "Pod", pod_name, namespace)
        restored = copy.deepcopy(owners)
        for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields"):
            restored["metadata"].pop(key, None)
        admin = control_plane.kube("admin")
        admin.delete("v1", "ConfigMap", name, namespace)
        admin.create(restored)
        webhook.restart(environment=honest_environment)
        wait_until(
            lambda: _planned_under(installer, namespace, owners),
            timeout=60,
            what="the owner's profile to be planned under again",
        )


def _planned_under(installer: Kube, namespace: str, configmap: dict[str, Any]) -> bool:
    """Does a dry-run engine Pod come back planned under this signed ConfigMap's bundle?"""
    stored = installer.create(engine_pod(namespace, LARGE, name="probe"), dry_run=True)
    annotations = stored["metadata"].get("annotations") or {}
    if "kamiwaza.ai/plan" not in annotations:
        return False
    digest = plan_of(stored).get("bundle", {}).get("sha256")
    return bool(digest) and digest in json.dumps(configmap)
