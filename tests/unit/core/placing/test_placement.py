"""Placement rules: every filter reason, its resolvability, the requests arithmetic and best fit.

Nodes are built with `localcluster.nodes.kwok.FakeNode`, which carries the labels GPU Feature
Discovery publishes, so these tests pin the label names the extender reads to the ones the fake
cluster (and GFD) writes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from inference_policy.base.codes import NodeVerdictCode
from inference_policy.base.quantity import QuantityError, resource_units
from inference_policy.placing.ledger import (
    HOLDING_PODS_FIELD_SELECTOR,
    UsageLedger,
    accounted_pod,
    holding_part,
    pod_key,
    pod_requests,
)
from inference_policy.placing.nodes import GFD_CUDA_MAJOR, NodeFacts, Verdict, node_facts
from inference_policy.placing.placement import (
    best_fit_scales,
    check,
    check_nodes,
    demand_for,
    score,
    score_nodes,
)
from inference_policy.planning.plan import Plan, PlanError, parse_plan
from inference_policy.trust.profile import CpuBinding, ExtendedResourceBinding, VramPluginBinding
from kits.fleetkit import A100_MIG, gh200, h100, l40s, no_gfd, t4
from kits.fleetkit import r570 as fleet_r570
from kits.profilekit import NOW, Owner, gpu_binding, gpu_profile, request, with_profiles
from localcluster.nodes.kwok import FakeNode

GI = 1024**3


def whole(**changes: Any) -> ExtendedResourceBinding:
    return ExtendedResourceBinding.model_validate(gpu_binding("whole-amd64", **changes))


def mig(shape: str = "3g.40gb", memory: str = "38Gi", **changes: Any) -> ExtendedResourceBinding:
    return ExtendedResourceBinding.model_validate(
        gpu_binding("mig-amd64", resource=f"nvidia.com/mig-{shape}", memory=memory, **changes)
    )


def vram(**changes: Any) -> VramPluginBinding:
    values: dict[str, Any] = {"cc": "8.9", "cuda": 12, "memory": "44Gi"}
    values.update(changes)
    return VramPluginBinding.model_validate(
        gpu_binding(
            "share-amd64",
            allocator="vram-plugin",
            resource="kamiwaza.ai/vram-gb-gpu-0",
            **values,
        )
    )


def plan(binding: Any, quantity: int = 1, arch: str = "amd64") -> dict[str, Any]:
    """A whole gpu plan, as the planner writes one, for the binding."""
    name = binding.resource.name
    return {
        "status": 200,
        "path": "gpu",
        "derived": True,
        "profile": "p",
        "bindingId": binding.id,
        "engine": "llamacpp",
        "variantId": "llamacpp-nvidia-amd64",
        "image": "registry.invalid/llamacpp@sha256:" + "1" * 64,
        "runtimeClassName": "nvidia",
        "nodeSelector": {"kubernetes.io/arch": arch},
        "resources": {"requests": {name: str(quantity)}, "limits": {name: str(quantity)}},
        "deviceCount": 1,
        "engineArgs": {},
        "inferenceResources": {
            "schemaVersion": 1,
            "accelerator": {"capability": "gpu", "count": 1, "memory": {"minimum": "7Gi"}},
            "runtime": {"selection": "automatic"},
        },
        "bundle": {"version": 1, "sha256": "0" * 64},
    }


def cpu_plan(cpu: str = "2", memory: str = "8Gi", arch: str = "amd64") -> dict[str, Any]:
    """A whole cpu plan, as the planner writes one."""
    return {
        "status": 200,
        "path": "cpu",
        "derived": True,
        "profile": "cpu",
        "bindingId": "cpu-amd64",
        "engine": "llamacpp",
        "variantId": "llamacpp-cpu-amd64",
        "image": "registry.invalid/llamacpp-cpu@sha256:" + "2" * 64,
        "runtimeClassName": None,
        "nodeSelector": {"kubernetes.io/arch": arch},
        "resources": {"requests": {"cpu": cpu, "memory": memory}},
        "deviceCount": 0,
        "engineArgs": {},
        "inferenceResources": {
            "schemaVersion": 1,
            "cpu": {"architecture": arch, "requests": {"cpu": cpu, "memory": memory}},
            "runtime": {"selection": "automatic"},
        },
        "bundle": None,
    }


def node(
    spec: FakeNode, drop: tuple[str, ...] = (), labels: dict[str, str] | None = None
) -> dict[str, Any]:
    manifest = spec.manifest()
    for key in drop:
        manifest["metadata"]["labels"].pop(key, None)
    manifest["metadata"]["labels"].update(labels or {})
    return manifest


def fits(
    plan_doc: Any, binding: Any, node_doc: Any, used: dict[str, int]
) -> tuple[bool, None] | tuple[bool, str, bool]:
    """The extender's answer for one Pod and node over raw documents, as a tuple to compare:
    `(True, None)` or `(False, reason, unresolvable)`; a plan it cannot read refuses every node."""
    try:
        parsed = plan_doc if isinstance(plan_doc, Plan) else parse_plan(plan_doc)
        if parsed.path == "external":
            return (True, None)
        demand = demand_for(parsed, binding)
    except PlanError as exc:
        return (False, str(exc), True)
    found = check(demand, node_facts(node_doc), used)
    return (True, None) if found.fits else (False, str(found.reason), found.unresolvable)


def verdict(plan_doc: Any, binding: Any, node_doc: Any, used: dict[str, int] | None = None) -> Any:
    return fits(plan_doc, binding, node_doc, used or {})


H100 = h100("h100-a")
L40S = l40s("l40s-a")


# -- fits ---------------------------------------------------------------------------------------


def test_whole_gpu_binding_fits_a_matching_node() -> None:
    assert verdict(plan(whole()), whole(), node(H100)) == (True, None)


def test_mig_binding_fits_a_mixed_strategy_node_with_the_shape() -> None:
    assert verdict(plan(mig()), mig(), node(A100_MIG)) == (True, None)


def test_vram_share_fits_its_bucket() -> None:
    binding = vram()
    assert verdict(plan(binding, 20), binding, node(L40S), {binding.resource.name: 28}) == (
        True,
        None,
    )


def test_a_real_plan_from_the_planner_places_on_a_real_looking_node() -> None:
    owner = Owner()
    envelope = with_profiles(
        owner,
        gpu_profile(
            "nvidia-mig-3g40gb",
            "mig",
            [gpu_binding("mig-3g40gb-amd64", resource="nvidia.com/mig-3g.40gb", memory="38Gi")],
        ),
    )
    state = owner.state(envelope)
    decision = state.decide(request(), NOW)
    assert decision.allowed, decision.body
    annotation = json.dumps(decision.body, separators=(",", ":"))
    parsed = parse_plan(annotation)
    assert state.profile is not None
    found = state.profile.envelope.binding(parsed.bindingId or "")
    assert found is not None
    assert fits(parsed, found[1], node(A100_MIG), {}) == (True, None)
    assert fits(parsed, found[1], node(H100), {})[0] is False


# -- architecture and resource ------------------------------------------------------------------


def test_wrong_architecture_is_unresolvable() -> None:
    arm = gh200("gh200")
    assert verdict(plan(whole()), whole(), node(arm)) == (
        False,
        "node architecture is arm64; binding whole-amd64 runs on amd64 nodes only",
        True,
    )


def test_missing_architecture_label_is_unresolvable() -> None:
    result = verdict(plan(whole()), whole(), node(H100, drop=("kubernetes.io/arch",)))
    assert result[0] is False and result[2] is True
    assert "no kubernetes.io/arch label" in str(result[1])


def test_absent_resource_is_unresolvable() -> None:
    result = verdict(plan(mig()), mig(), node(H100))
    assert result == (
        False,
        "node advertises no nvidia.com/mig-3g.40gb in its allocatable resources",
        True,
    )


def test_zero_allocatable_is_unresolvable() -> None:
    empty = FakeNode("drained", gpus=1, extra_resources={"nvidia.com/gpu": "0"})
    result = verdict(plan(whole()), whole(), node(empty))
    assert result == (False, "node advertises 0 nvidia.com/gpu in its allocatable resources", True)


def test_not_enough_free_is_resolvable() -> None:
    result = verdict(plan(whole(), 2), whole(), node(H100), {"nvidia.com/gpu": 7})
    assert result == (
        False,
        "not enough free nvidia.com/gpu: the Pod requests 2, and 1 of 8 is free",
        False,
    )


def test_request_above_whole_allocatable_is_unresolvable() -> None:
    small = FakeNode("two-gpus", gpus=2)
    result = verdict(plan(whole(), 4), whole(), node(small))
    assert result == (
        False,
        "the Pod requests 4 nvidia.com/gpu but the node's whole allocatable is 2",
        True,
    )


# -- GPU Feature Discovery facts ----------------------------------------------------------------


def test_node_without_gfd_labels_is_refused_fail_closed() -> None:
    bare = no_gfd("no-gfd", gpus=4)
    result = verdict(plan(whole()), whole(), node(bare))
    assert result == (
        False,
        "node has no GPU Feature Discovery labels; cannot confirm the accelerator binding "
        "whole-amd64 attests",
        True,
    )


def test_lower_compute_capability_contradicts_the_attestation() -> None:
    turing = t4("t4")
    binding = whole(memory="15Gi")
    result = verdict(plan(binding), binding, node(turing))
    assert result == (
        False,
        "GPU Feature Discovery reports compute capability 7.5 (nvidia.com/gpu.compute.major/"
        "nvidia.com/gpu.compute.minor); binding whole-amd64 attests 8.0, the lowest on its nodes",
        True,
    )


def test_higher_compute_capability_is_fine() -> None:
    binding = whole(cc="8.0")
    assert verdict(plan(binding), binding, node(H100))[0] is True


def test_minor_capability_compares_as_a_pair() -> None:
    ada = FakeNode("l4", gpu_product="NVIDIA-L4", compute_capability="8.9", vram_gb=24)
    binding = whole(cc="9.0", memory="22Gi")
    assert verdict(plan(binding), binding, node(ada))[2] is True
    binding = whole(cc="8.6", memory="22Gi")
    assert verdict(plan(binding), binding, node(ada)) == (True, None)


def test_missing_compute_capability_labels_cannot_confirm() -> None:
    result = verdict(plan(whole()), whole(), node(H100, drop=("nvidia.com/gpu.compute.minor",)))
    assert result[0] is False and result[2] is True
    assert "cannot confirm the compute capability" in str(result[1])


def test_older_cuda_driver_contradicts_the_attestation() -> None:
    r570 = fleet_r570("r570")
    result = verdict(plan(whole(cuda=13)), whole(cuda=13), node(r570))
    assert result == (
        False,
        "GPU Feature Discovery reports a driver for CUDA 12 (nvidia.com/cuda.runtime-version."
        "major); binding whole-amd64 attests cudaDriverMajor 13",
        True,
    )


def test_cuda_check_reads_the_cuda_version_not_the_kernel_driver_release() -> None:
    # cuda.driver.major is 580 here: reading it would wrongly pass a CUDA 12 driver.
    r570 = FakeNode("r570", cuda_driver_major=12, driver_version="580.1.2")
    labels = r570.gfd_labels()
    assert labels["nvidia.com/cuda.driver.major"] == "580"
    assert verdict(plan(whole(cuda=13)), whole(cuda=13), node(r570))[0] is False


def test_deprecated_cuda_runtime_label_is_read_when_the_new_one_is_absent() -> None:
    old = node(FakeNode("old-gfd", cuda_driver_major=12), drop=(GFD_CUDA_MAJOR,))
    result = verdict(plan(whole(cuda=13)), whole(cuda=13), old)
    assert result[0] is False and "nvidia.com/cuda.runtime.major" in str(result[1])


def test_no_cuda_label_at_all_cannot_confirm_an_attested_driver() -> None:
    bare = node(H100, drop=(GFD_CUDA_MAJOR, "nvidia.com/cuda.runtime.major"))
    result = verdict(plan(whole(cuda=13)), whole(cuda=13), bare)
    assert result[0] is False and result[2] is True
    assert "cannot confirm the cudaDriverMajor 13" in str(result[1])


def test_binding_without_cuda_attestation_skips_the_driver_check() -> None:
    r535 = FakeNode("r535", cuda_driver_major=12, driver_version="535.1.2")
    assert verdict(plan(whole(cuda=None)), whole(cuda=None), node(r535)) == (True, None)


def test_smaller_gpu_memory_than_usable_contradicts_the_binding() -> None:
    a100_40 = FakeNode("a100-40", gpu_product="NVIDIA-A100-SXM4-40GB", vram_gb=40)
    binding = whole(memory="79Gi")
    result = verdict(plan(binding), binding, node(a100_40))
    assert result == (
        False,
        "GPU Feature Discovery reports 40960 MiB per device (nvidia.com/gpu.memory); "
        "whole-amd64 attests 79Gi usable",
        True,
    )


def test_time_sliced_gpus_are_not_whole_devices() -> None:
    shared = node(
        H100,
        labels={"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"},
    )
    result = verdict(plan(whole()), whole(), shared)
    assert result[0] is False and result[2] is True
    assert "node shares its GPUs (nvidia.com/gpu.sharing-strategy=time-slicing" in str(result[1])
    assert verdict(plan(vram()), vram(), shared)[0] is False  # other reasons, not sharing
    assert Verdict(False, "x", True, NodeVerdictCode.SHARED_DEVICE).code == "shared-device"


def test_gfd_replicas_zero_on_mig_enabled_gpus_is_not_sharing() -> None:
    # GFD writes replicas=0 for MIG-enabled parents (sharing disabled), which is not sharing.
    mixed = FakeNode("mixed", gpus=2, mig={"3g.40gb": 2}, whole_gpus=1)
    labels = node(mixed, labels={"nvidia.com/gpu.replicas": "0"})
    assert verdict(plan(whole()), whole(), labels) == (True, None)


def test_single_strategy_mig_slices_are_not_whole_gpus() -> None:
    single = FakeNode(
        "a100-single",
        gpu_product="NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
        compute_capability="8.0",
        mig={"1g.10gb": 7},
        mig_strategy="single",
        vram_gb=10,
    )
    binding = whole(memory="9Gi")
    result = verdict(plan(binding), binding, node(single))
    assert result[0] is False and result[2] is True
    assert str(result[1]).startswith("node's nvidia.com/gpu devices are MIG slices")


def test_single_strategy_slice_labels_mark_mig_slices() -> None:
    sliced = node(
        H100, labels={"nvidia.com/gpu.slices.gi": "1", "nvidia.com/mig.strategy": "single"}
    )
    result = verdict(plan(whole()), whole(), sliced)
    assert result[0] is False and "are MIG slices" in str(result[1])


def test_mig_binding_needs_the_mixed_strategy() -> None:
    single = FakeNode(
        "a100-odd",
        compute_capability="8.0",
        mig={"3g.40gb": 2},
        mig_strategy="single",
        extra_resources={"nvidia.com/mig-3g.40gb": "2"},
    )
    result = verdict(plan(mig()), mig(), node(single))
    assert result == (
        False,
        "node's MIG strategy is single (nvidia.com/mig.strategy); binding mig-amd64 requests "
        "nvidia.com/mig-3g.40gb, a name only the mixed strategy advertises (single advertises "
        "slices as nvidia.com/gpu)",
        True,
    )


def test_mig_binding_without_a_strategy_label_cannot_confirm() -> None:
    result = verdict(plan(mig()), mig(), node(A100_MIG, drop=("nvidia.com/mig.strategy",)))
    assert result[0] is False and "no nvidia.com/mig.strategy label" in str(result[1])


def test_mig_product_label_must_name_the_shape() -> None:
    wrong = node(
        A100_MIG, labels={"nvidia.com/mig-3g.40gb.product": "NVIDIA-A100-SXM4-80GB-MIG-2g"}
    )
    result = verdict(plan(mig()), mig(), wrong)
    assert result == (
        False,
        "nvidia.com/mig-3g.40gb.product is NVIDIA-A100-SXM4-80GB-MIG-2g, not a 3g.40gb MIG "
        "slice as binding mig-amd64 requests",
        True,
    )
    missing = node(A100_MIG, drop=("nvidia.com/mig-3g.40gb.product",))
    assert "no nvidia.com/mig-3g.40gb.product label" in str(verdict(plan(mig()), mig(), missing)[1])


def test_shared_mig_slices_are_not_exclusive_partitions() -> None:
    shared = node(
        A100_MIG,
        labels={
            "nvidia.com/mig-3g.40gb.product": "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb-SHARED",
            "nvidia.com/mig-3g.40gb.replicas": "2",
            "nvidia.com/mig-3g.40gb.sharing-strategy": "time-slicing",
        },
    )
    result = verdict(plan(mig()), mig(), shared)
    assert result[0] is False and result[2] is True
    assert "shares its 3g.40gb MIG slices" in str(result[1])


def test_mig_slice_memory_is_checked_against_usable_memory() -> None:
    binding = mig(memory="41Gi")
    result = verdict(plan(binding), binding, node(A100_MIG))
    assert "reports 40960 MiB per device (nvidia.com/mig-3g.40gb.memory)" in str(result[1])


def test_amd_binding_is_not_judged_by_nvidia_labels() -> None:
    binding = ExtendedResourceBinding.model_validate(
        gpu_binding("amd-amd64", vendor="amd", cuda=None, resource="amd.com/gpu")
    )
    mi300 = FakeNode("mi300", gpus=0, extra_resources={"amd.com/gpu": "8"})
    assert verdict(plan(binding), binding, node(mi300)) == (True, None)


# -- accounted VRAM shares ----------------------------------------------------------------------


def test_vram_share_over_the_bucket_is_resolvable() -> None:
    binding = vram()
    result = verdict(plan(binding, 20), binding, node(L40S), {binding.resource.name: 30})
    assert result == (
        False,
        "accounted VRAM bucket kamiwaza.ai/vram-gb-gpu-0 is full: the share of binding "
        "share-amd64 needs 20 GB and 18 of 48 GB are free",
        False,
    )


def test_vram_share_larger_than_the_whole_bucket_is_unresolvable() -> None:
    small = FakeNode(
        "l4",
        gpu_product="NVIDIA-L4",
        compute_capability="8.9",
        cuda_driver_major=12,
        vram_gb=24,
        vram_budget=True,
    )
    binding = vram(memory="22Gi")
    result = verdict(plan(binding, 30), binding, node(small))
    assert result == (
        False,
        "the Pod requests 30 kamiwaza.ai/vram-gb-gpu-0 but the node's whole allocatable is 24",
        True,
    )


def test_node_without_the_vram_plugin_is_unresolvable() -> None:
    plain = FakeNode("l40s-plain", gpu_product="NVIDIA-L40S", compute_capability="8.9")
    result = verdict(plan(vram(), 4), vram(), node(plain))
    assert result[1] == "node advertises no kamiwaza.ai/vram-gb-gpu-0 in its allocatable resources"


# -- CPU plans ----------------------------------------------------------------------------------


def test_cpu_plan_checks_only_architecture_and_cpu_memory() -> None:
    cpu_node = FakeNode("cpu-1", gpus=0, cpu="8", memory="32Gi")
    assert verdict(cpu_plan(), None, node(cpu_node)) == (True, None)
    busy = verdict(cpu_plan(), None, node(cpu_node), {"cpu": 7000})
    assert busy == (False, "not enough free cpu: the Pod requests 2, and 1 of 8 is free", False)
    mem = verdict(cpu_plan(memory="8Gi"), None, node(cpu_node), {"memory": 30 * GI})
    assert mem == (
        False,
        "not enough free memory: the Pod requests 8Gi, and 2Gi of 32Gi is free",
        False,
    )
    arm = FakeNode("cpu-arm", arch="arm64", gpus=0)
    assert verdict(cpu_plan(), None, node(arm))[2] is True


def test_cpu_plan_without_binding_in_the_profile_still_places() -> None:
    cpu_binding = CpuBinding.model_validate(Owner().envelope()["profiles"][0]["bindings"][0])
    cpu_node = FakeNode("cpu-1", gpus=0)
    assert verdict(cpu_plan(), cpu_binding, node(cpu_node)) == (True, None)


def test_external_plan_passes() -> None:
    external = {"status": 200, "path": "external", "derived": True, "engine": "llamacpp"}
    assert fits(external, None, node(H100), {}) == (True, None)


# -- malformed plans and disagreements ----------------------------------------------------------


def _broken(change: Any) -> str:
    document = cpu_plan()
    change(document)
    return json.dumps(document)


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        ("{not json", "annotation cannot be read"),
        ("[]", "is not a JSON object"),
        ('{"path":"gpu","path":"cpu"}', "duplicate key"),
        (_broken(lambda d: d.update(path="tpu")), "path: Input should be"),
        (_broken(lambda d: d.update(path="gpu")), "must name its bindingId and bundle"),
        (_broken(lambda d: d.update(nodeSelector={})), "nodeSelector must name"),
        (_broken(lambda d: d.update(resources={"requests": {}})), "resources.requests must"),
        (_broken(lambda d: d["resources"]["requests"].update(cpu="lots")), "'lots' is not a"),
        (_broken(lambda d: d.pop("image")), "must carry image"),
        (_broken(lambda d: d.update(status=422)), "status is not 200"),
    ],
)
def test_malformed_plans_are_refused_with_the_reason(annotation: str, message: str) -> None:
    with pytest.raises(PlanError, match=message.replace("(", r"\(")):
        parse_plan(annotation)
    ok, *rest = fits(annotation, whole(), node(H100), {})
    assert ok is False and rest[1] is True and message in str(rest[0])


def test_binding_missing_from_the_profile() -> None:
    with pytest.raises(PlanError, match="binding whole-amd64 is not in the verified profile"):
        demand_for(parse_plan(plan(whole())), None)


def test_plan_and_binding_architectures_must_agree() -> None:
    with pytest.raises(PlanError, match="runs on amd64"):
        demand_for(parse_plan(plan(whole(), arch="arm64")), whole())


def test_plan_must_request_the_bindings_resource() -> None:
    with pytest.raises(PlanError, match=r"does not request nvidia\.com/mig-3g\.40gb"):
        demand_for(parse_plan(plan(whole())), mig())


def test_pod_must_request_what_its_plan_grants() -> None:
    pod = {
        "spec": {
            "containers": [{"name": "engine", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]
        }
    }
    with pytest.raises(PlanError, match=r"requests 2 nvidia\.com/gpu but its plan grants 1"):
        demand_for(parse_plan(plan(whole())), whole(), pod)


def test_a_cpu_binding_cannot_back_a_gpu_plan() -> None:
    cpu_binding = CpuBinding.model_validate(Owner().envelope()["profiles"][0]["bindings"][0])
    doc = plan(whole())
    doc["bindingId"] = "cpu-amd64"
    with pytest.raises(PlanError, match="is a cpu binding"):
        demand_for(parse_plan(doc), cpu_binding)


# -- requests arithmetic ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        ("cpu", "2", 2000),
        ("cpu", "250m", 250),
        ("cpu", "0.1", 100),
        ("cpu", "1.0005", 1001),
        ("memory", "8Gi", 8 * GI),
        ("memory", "1G", 10**9),
        ("memory", "1e3", 1000),
        ("memory", "128974848", 128974848),
        ("nvidia.com/gpu", "1", 1),
        ("nvidia.com/gpu", 2, 2),
    ],
)
def test_quantities(name: str, text: Any, value: int) -> None:
    assert resource_units(name, text) == value


@pytest.mark.parametrize("text", ["", "1Gb", "-1", "x", True, None, "1e99"])
def test_bad_quantities(text: Any) -> None:
    with pytest.raises(QuantityError):
        resource_units("memory", text)


def _container(name: str, requests: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": requests}, **extra}


def test_pod_requests_follow_the_scheduler_rules() -> None:
    pod = {
        "spec": {
            "containers": [
                _container("engine", {"cpu": "1", "memory": "4Gi"}),
                {"name": "gpu", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            ],
            "initContainers": [
                _container("fetch", {"cpu": "3", "memory": "1Gi"}),
                _container("proxy", {"cpu": "500m"}, restartPolicy="Always"),
                _container("late", {"cpu": "2"}),
            ],
            "overhead": {"memory": "64Mi"},
        }
    }
    assert pod_requests(pod) == {
        # containers 1 + sidecar 0.5 = 1.5; fetch alone 3; late 2 + sidecar 0.5 = 2.5 -> 3
        "cpu": 3000,
        "memory": 4 * GI + 64 * 1024**2,
        "nvidia.com/gpu": 1,
    }


def test_accounted_pods_are_bound_and_not_terminated() -> None:
    bound = {
        "metadata": {"namespace": "kamiwaza", "name": "a"},
        "spec": {"nodeName": "n1", "containers": [_container("c", {"cpu": "1"})]},
        "status": {"phase": "Running"},
    }
    assert accounted_pod(bound) == ("n1", {"cpu": 1000})
    assert accounted_pod({**bound, "spec": {"containers": []}}) is None
    assert accounted_pod({**bound, "status": {"phase": "Succeeded"}}) is None
    assert accounted_pod({**bound, "status": {"phase": "Failed"}}) is None
    unreadable = {
        **bound,
        "spec": {"nodeName": "n1", "containers": [_container("c", {"cpu": "?"})]},
    }
    assert accounted_pod(unreadable) is None


def _selected(pod: dict[str, Any], selector: str) -> bool:
    # The API server's reading of `path!=value` terms: an absent field is the empty string.
    for term in selector.split(","):
        path, _, value = term.partition("!=")
        assert path and "=" not in path, f"only != terms are expected, got {term!r}"
        field: Any = pod
        for part in path.split("."):
            field = field.get(part) if isinstance(field, dict) else None
        if ("" if field is None else str(field)) == value:
            return False
    return True


@pytest.mark.parametrize("node", [None, "", "n1"])
@pytest.mark.parametrize("phase", [None, "Pending", "Running", "Succeeded", "Failed", "Unknown"])
def test_the_watch_selector_selects_exactly_the_pods_the_ledger_counts(
    node: str | None, phase: str | None
) -> None:
    # The extender's Pod watch asks the API server for these Pods only; one it leaves out
    # must be one the ledger would not count, and the other way round.
    spec: dict[str, Any] = {"containers": [_container("c", {"cpu": "1"})]}
    if node is not None:
        spec["nodeName"] = node
    pod: dict[str, Any] = {"metadata": {"namespace": "kamiwaza", "name": "a"}, "spec": spec}
    if phase is not None:
        pod["status"] = {"phase": phase}
    assert _selected(pod, HOLDING_PODS_FIELD_SELECTOR) == (accounted_pod(pod) is not None)


_ANY = st.one_of(st.none(), st.integers(), st.text(max_size=3), st.lists(st.none(), max_size=1))
_QUANTITY = st.sampled_from(["1", "500m", "8Gi", "?", "-1", "1e3"]) | _ANY
_RESOURCES = st.dictionaries(
    st.sampled_from(["requests", "limits", "claims"]),
    st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), _QUANTITY, max_size=3)
    | _ANY,
    max_size=3,
)
_CONTAINER = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(max_size=3) | _ANY,
        "resources": _RESOURCES | _ANY,
        "restartPolicy": st.sampled_from(["Always", "Never"]) | _ANY,
        "env": st.lists(st.fixed_dictionaries({"name": st.text(max_size=3)}), max_size=2),
        "image": st.text(max_size=5),
    },
)
_POD = st.fixed_dictionaries(
    {},
    optional={
        "apiVersion": st.just("v1"),
        "kind": st.just("Pod"),
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                "name": st.text(max_size=3) | _ANY,
                "namespace": st.text(max_size=3) | _ANY,
                "uid": st.text(max_size=3),
                "resourceVersion": st.text(max_size=3),
                "annotations": st.dictionaries(st.text(max_size=3), st.text(max_size=9)),
            },
        )
        | _ANY,
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "nodeName": st.sampled_from(["", "n1"]) | _ANY,
                "containers": st.lists(_CONTAINER | _ANY, max_size=3) | _ANY,
                "initContainers": st.lists(_CONTAINER | _ANY, max_size=3) | _ANY,
                "overhead": st.dictionaries(st.sampled_from(["cpu", "memory"]), _QUANTITY) | _ANY,
                "volumes": st.lists(st.fixed_dictionaries({"name": st.text(max_size=3)})),
            },
        )
        | _ANY,
        "status": st.fixed_dictionaries(
            {},
            optional={
                "phase": st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]) | _ANY,
                "conditions": st.lists(st.fixed_dictionaries({"type": st.text(max_size=3)})),
            },
        )
        | _ANY,
    },
)


_SIDECARS = {
    "metadata": {"namespace": "kamiwaza", "name": "a", "uid": "u", "labels": {"x": "y"}},
    "spec": {
        "nodeName": "n1",
        "containers": [_container("engine", {"cpu": "1"}, image="i", env=[{"name": "A"}])],
        "initContainers": [
            _container("fetch", {"cpu": "3"}),
            # A sidecar larger than what runs before it: it counts beside the containers.
            _container("proxy", {"cpu": "4"}, restartPolicy="Always"),
            _container("late", {"cpu": "2"}),
        ],
        "overhead": {"memory": "64Mi"},
    },
    "status": {"phase": "Running", "conditions": [{"type": "Ready"}]},
}


@settings(max_examples=3000, deadline=None)
@given(_POD)
@example(_SIDECARS)
@example({**_SIDECARS, "status": {"phase": "Succeeded"}})
def test_a_pods_holding_part_holds_what_the_pod_holds(pod: dict[str, Any]) -> None:
    """The extender's informer keeps each Pod's `holding_part` only: the ledger must count it,
    key it and refuse it exactly as it does the whole Pod."""
    part = holding_part(pod)
    assert accounted_pod(part) == accounted_pod(pod)
    assert pod_key(part) == pod_key(pod)
    meta = pod.get("metadata")
    if isinstance(meta, dict):
        for key in ("uid", "resourceVersion"):
            assert part["metadata"].get(key) == meta.get(key)
        assert "annotations" not in part["metadata"]
    if isinstance(pod.get("spec"), dict):
        assert "volumes" not in part["spec"]


def test_ledger_moves_and_removes_pods() -> None:
    ledger = UsageLedger()
    ledger.upsert("ns/a", "n1", {"nvidia.com/gpu": 2, "cpu": 1000})
    ledger.upsert("ns/b", "n1", {"nvidia.com/gpu": 1})
    assert ledger.used("n1") == {"nvidia.com/gpu": 3, "cpu": 1000}
    ledger.upsert("ns/a", "n2", {"nvidia.com/gpu": 2})
    assert ledger.used("n1") == {"nvidia.com/gpu": 1}
    assert ledger.used("n2") == {"nvidia.com/gpu": 2}
    ledger.remove("ns/b")
    ledger.remove("ns/missing")
    assert ledger.used("n1") == {}
    assert len(ledger) == 1 and ledger.node_of("ns/a") == "n2"
    ledger.apply("ns/a", None)
    assert len(ledger) == 0 and ledger.used("n2") == {}


def test_ledger_counts_an_update_that_holds_the_same_as_no_change() -> None:
    # A bound Pod's status updates must not make readers judge its node again.
    ledger = UsageLedger()
    ledger.upsert("ns/a", "n1", {"nvidia.com/gpu": 2})
    seen = ledger.version
    ledger.upsert("ns/a", "n1", {"nvidia.com/gpu": 2})
    assert ledger.version == seen and ledger.changed_since(seen) == set()
    ledger.upsert("ns/a", "n1", {"nvidia.com/gpu": 1})
    assert ledger.changed_since(seen) == {"n1"} and ledger.used("n1") == {"nvidia.com/gpu": 1}
    seen = ledger.version
    ledger.upsert("ns/a", "n2", {"nvidia.com/gpu": 1})
    assert ledger.changed_since(seen) == {"n1", "n2"}


# -- best fit -----------------------------------------------------------------------------------


def _facts(spec: FakeNode) -> NodeFacts:
    return node_facts(spec.manifest())


def test_score_is_ten_when_the_pod_exactly_fills_the_node() -> None:
    binding = whole()
    demand = demand_for(parse_plan(plan(binding)), binding)
    facts = _facts(H100)
    scales = best_fit_scales(demand, [facts])
    assert scales == {"nvidia.com/gpu": 8}
    assert score(demand, facts, {"nvidia.com/gpu": 7}, scales) == 10
    assert score(demand, facts, {"nvidia.com/gpu": 6}, scales) == 8
    assert score(demand, facts, {}, scales) == 1
    assert score(demand, facts, {"nvidia.com/gpu": 8}, scales) == 0


def test_best_fit_prefers_the_node_left_with_the_least_free_capacity() -> None:
    binding = whole()
    demand = demand_for(parse_plan(plan(binding)), binding)
    nodes = [
        _facts(FakeNode("big-empty", gpus=8)),
        _facts(FakeNode("small-empty", gpus=2)),
        _facts(FakeNode("big-busy", gpus=8)),
    ]
    used = {"big-busy": {"nvidia.com/gpu": 7}}
    scales = best_fit_scales(demand, nodes)
    scores = {n.name: score(demand, n, used.get(n.name, {}), scales) for n in nodes}
    assert scores == {"big-empty": 1, "small-empty": 8, "big-busy": 10}
    assert max(scores, key=lambda n: scores[n]) == "big-busy"


def test_vram_best_fit_is_linear_in_the_leftover() -> None:
    binding = vram()
    demand = demand_for(parse_plan(plan(binding, 10)), binding)
    facts = _facts(L40S)
    scales = best_fit_scales(demand, [facts])
    name = binding.resource.name
    got = [score(demand, facts, {name: used}, scales) for used in (38, 34, 24, 14, 0)]
    assert got == [10, 9, 7, 5, 2]
    assert got == sorted(got, reverse=True)


def test_cpu_best_fit_averages_cpu_and_memory() -> None:
    demand = demand_for(parse_plan(cpu_plan("4", "16Gi")), None)
    facts = _facts(FakeNode("cpu", gpus=0, cpu="8", memory="32Gi"))
    scales = best_fit_scales(demand, [facts])
    assert score(demand, facts, {"cpu": 4000, "memory": 16 * GI}, scales) == 10
    assert score(demand, facts, {}, scales) == 5


def test_a_refused_node_scores_zero() -> None:
    demand = demand_for(parse_plan(plan(mig())), mig())
    facts = _facts(H100)
    assert score(demand, facts, {}, best_fit_scales(demand, [facts])) == 0


def test_static_verdicts_are_memoised_per_demand() -> None:
    binding = whole()
    demand = demand_for(parse_plan(plan(binding)), binding, profile_sha256="a")
    facts = _facts(H100)
    assert check(demand, facts, {}).fits
    assert list(facts.static) == [demand.key]
    # The memo holds only load-independent facts: usage still changes the answer.
    assert not check(demand, facts, {"nvidia.com/gpu": 8}).fits
    other = demand_for(parse_plan(plan(binding)), binding, profile_sha256="b")
    assert check(other, facts, {}).fits and len(facts.static) == 2


@pytest.mark.parametrize("kind", ["whole", "mig", "share", "cpu"])
def test_batch_forms_agree_with_the_single_node_forms(kind: str) -> None:
    bindings: dict[str, Any] = {"whole": whole(), "mig": mig(), "share": vram(), "cpu": None}
    binding = bindings[kind]
    document = (
        cpu_plan("3", "20Gi") if binding is None else plan(binding, 8 if kind == "share" else 1)
    )
    demand = demand_for(parse_plan(document), binding)
    specs = [H100, A100_MIG, L40S, h100("h100-2", gpus=2), gh200("arm")]
    facts: list[NodeFacts | None] = [_facts(spec) for spec in specs] + [None]
    names = [spec.name for spec in specs] + ["unknown"]
    for load in range(0, 50, 7):
        usage = {
            name: {
                "nvidia.com/gpu": load % 9,
                "nvidia.com/mig-3g.40gb": load % 5,
                "kamiwaza.ai/vram-gb-gpu-0": load,
                "cpu": load * 1000,
                "memory": load * GI,
            }
            for name in names
        }
        batch = check_nodes(demand, facts, lambda n, u=usage: u[n])  # type: ignore[misc]
        single = [None if f is None else check(demand, f, usage[f.name]) for f in facts]
        assert batch == single
        scales = best_fit_scales(demand, [f for f in facts if f is not None])
        scores = score_nodes(demand, facts, lambda n, u=usage: u[n])  # type: ignore[misc]
        if binding is None:
            # Changed on purpose: a CPU Pod scores every accelerator node at the bottom (0),
            # and every node here but the arm64 one (which it cannot use) advertises one.
            assert scores == [0] * len(facts)
            continue
        assert scores == [
            0 if f is None else score(demand, f, usage[f.name], scales) for f in facts
        ]
