"""One tenant per non-isolating device (`inference_policy.placing.tenancy`): which allocation
classes isolate, the owner's `sharing.acrossTenants` in the signed profile, the ledger's shares by
tenant, the rule as placement and the room figures apply it, the capacity replay, and the
controller's report (`inference_policy.granting.grant_tenants`)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from extender.tenants import Tenant
from extender.view import ClusterView
from inference_policy.allocation import (
    ACCOUNTED_SHARE,
    CLASSES,
    DRA_GPU,
    DRA_MIG,
    MIG,
    WHOLE_DEVICE,
)
from inference_policy.base.codes import (
    SHARED_WITH_ANOTHER_TENANT,
    VERIFIED,
    VERIFIED_SHARED_WITH_ANOTHER_TENANT,
    NodeVerdictCode,
)
from inference_policy.granting.grant import Verdict as GrantVerdict
from inference_policy.granting.grant_tenants import kept_apart
from inference_policy.placing.ledger import UsageLedger
from inference_policy.placing.nodes import node_facts
from inference_policy.placing.placement import binding_demand, check_nodes, free_of
from inference_policy.placing.room_figures import figures_of
from inference_policy.placing.tenancy import (
    Tenancy,
    TenantShares,
    apart_verdict,
    crossing,
    gpu_index,
    gpu_label,
    shares_gpu,
)
from inference_policy.tools.capacity import Deployment, replay
from inference_policy.tools.revisions_compare import binding_changes
from inference_policy.trust.profile import (
    ExtendedResourceBinding,
    ProfileSchemaError,
    VramPluginBinding,
    parse_envelope,
)
from kits.fleetkit import h100, l40s
from kits.podstates import bind, planned_pod
from kits.profilekit import NOW, Owner, gpu_binding, gpu_profile, request, with_profiles

GPU0 = "kamiwaza.ai/vram-gb-gpu-0"
GPU1 = "kamiwaza.ai/vram-gb-gpu-1"
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


def share_binding(binding_id: str = "share-0", resource: str = GPU0, **sharing: Any) -> Any:
    document = gpu_binding(
        binding_id, allocator="vram-plugin", resource=resource, cc="8.9", cuda=12, memory="44Gi"
    )
    if sharing:
        document["sharing"] = sharing
    return document


def share_envelope(owner: Owner, *bindings: dict[str, Any], namespace: str) -> dict[str, Any]:
    envelope = with_profiles(owner, gpu_profile("share", "accounted-share", list(bindings)))
    envelope["namespace"] = namespace
    return envelope


def binding(**sharing: Any) -> VramPluginBinding:
    return VramPluginBinding.model_validate(share_binding(**sharing))


# -- which classes isolate ---------------------------------------------------------------------


def test_only_the_accounted_share_does_not_isolate() -> None:
    assert [c for c in CLASSES if not c.isolates] == [ACCOUNTED_SHARE]
    assert all(c.isolates for c in (WHOLE_DEVICE, MIG, DRA_GPU, DRA_MIG))
    assert shares_gpu(GPU0) and not shares_gpu("nvidia.com/gpu")
    assert not shares_gpu("nvidia.com/mig-3g.40gb") and not shares_gpu("cpu")


def test_a_per_gpu_bucket_names_its_gpu() -> None:
    assert gpu_index("kamiwaza.ai/vram-gb-gpu-3") == "3"
    assert gpu_label(GPU1) == f"GPU 1 ({GPU1})"
    assert gpu_index("kamiwaza.ai/vram-gb-l40s") is None
    assert gpu_label("kamiwaza.ai/vram-gb-l40s") == "the GPU of bucket kamiwaza.ai/vram-gb-l40s"


# -- the owner's value in the signed profile ---------------------------------------------------


def test_sharing_across_tenants_is_off_unless_the_binding_says_so() -> None:
    assert not binding().crosses_tenants
    assert not binding(acrossTenants=False).crosses_tenants
    assert binding(acrossTenants=True).crosses_tenants


@pytest.mark.parametrize(
    ("sharing", "message"),
    [
        ({}, "acrossTenants"),
        ({"acrossTenants": "true"}, "acrossTenants"),
        ({"acrossTenants": True, "withinTenant": True}, "withinTenant"),
    ],
)
def test_the_sharing_value_is_strict(sharing: dict[str, Any], message: str) -> None:
    owner = Owner()
    document = share_binding()
    document["sharing"] = sharing
    with pytest.raises(ProfileSchemaError, match=message):
        parse_envelope(share_envelope(owner, document, namespace="team-a"))


def test_an_isolating_binding_takes_no_sharing_value() -> None:
    owner = Owner()
    whole = gpu_binding("whole-amd64")
    whole["sharing"] = {"acrossTenants": True}
    envelope = with_profiles(owner, gpu_profile("whole", "whole-device", [whole]))
    with pytest.raises(ProfileSchemaError, match="sharing"):
        parse_envelope(envelope)


def test_the_bindings_of_one_gpu_bucket_agree_on_sharing() -> None:
    owner = Owner()
    trusting = share_binding("share-a", acrossTenants=True)
    wary = share_binding("share-b")
    with pytest.raises(ProfileSchemaError, match="share-a and share-b share resource"):
        parse_envelope(share_envelope(owner, trusting, wary, namespace="team-a"))
    other_gpu = share_binding("share-b", GPU1)
    found = parse_envelope(share_envelope(owner, trusting, other_gpu, namespace="team-a"))
    assert crossing(found) == {GPU0}
    assert crossing(None) == frozenset()


def test_tmi_diff_names_a_change_of_trust() -> None:
    owner = Owner()
    old = parse_envelope(share_envelope(owner, share_binding(), namespace="team-a"))
    new = parse_envelope(
        share_envelope(owner, share_binding(acrossTenants=True), namespace="team-a")
    )
    (change,) = binding_changes(old, new)
    assert (change.binding, change.change, change.fields) == ("share-0", "changed", ("sharing",))


# -- the ledger's shares by tenant ---------------------------------------------------------------


def test_the_ledger_keeps_each_nodes_shares_by_tenant() -> None:
    ledger = UsageLedger()
    ledger.upsert("team-a/p1", "n1", {GPU0: 4, "cpu": 2000})
    ledger.upsert("team-a/p2", "n1", {GPU0: 6})
    ledger.upsert("team-b/p3", "n1", {GPU1: 8})
    ledger.upsert("team-b/p4", "n1", {"nvidia.com/gpu": 1})
    assert ledger.shares("n1") == {GPU0: {"team-a": 10}, GPU1: {"team-b": 8}}
    ledger.upsert("team-a/p2", "n2", {GPU0: 6})  # moved
    assert ledger.shares("n1") == {GPU0: {"team-a": 4}, GPU1: {"team-b": 8}}
    assert ledger.shares("n2") == {GPU0: {"team-a": 6}}
    ledger.remove("team-a/p1")
    ledger.apply("team-b/p3", None)
    assert ledger.shares("n1") == {}
    assert ledger.used("n1") == {"nvidia.com/gpu": 1}


def test_tenant_shares_forget_a_tenant_whose_last_share_left() -> None:
    shares = TenantShares()
    shares.change("n1", "team-a", {GPU0: 3}, 1)
    shares.change("n1", "team-b", {GPU0: 5}, 1)
    shares.change("n1", "team-a", {GPU0: 3}, -1)
    assert shares.of("n1") == {GPU0: {"team-b": 5}}
    shares.change("n1", "team-b", {GPU0: 5}, -1)
    assert shares.of("n1") == {} and list(shares.nodes()) == []


# -- the rule ------------------------------------------------------------------------------------


def never(tenant: str, resource: str) -> bool:
    return False


def test_a_share_is_kept_off_a_gpu_where_another_tenant_holds_one() -> None:
    shares = {GPU0: {"team-a": 4}}
    assert apart_verdict("team-a", False, [GPU0], shares, never) is None
    assert apart_verdict("team-b", False, [GPU1], shares, never) is None
    found = apart_verdict("team-b", False, [GPU0], shares, never)
    assert found is not None and not found.fits
    assert found.code is NodeVerdictCode.OTHER_TENANT
    # The other tenant's share may leave: the scheduler retries the Pod.
    assert not found.unresolvable
    assert found.reason is not None
    assert "another tenant holds an accounted share on GPU 0" in found.reason
    # Tenants must not learn each other's names.
    assert "team-a" not in found.reason


def test_a_gpu_is_shared_across_tenants_only_where_every_tenants_binding_says_so() -> None:
    shares = {GPU0: {"team-a": 4, "team-c": 2}}

    def trusted(*tenants: str) -> Any:
        return lambda tenant, resource: tenant in tenants and resource == GPU0

    assert apart_verdict("team-b", True, [GPU0], shares, trusted("team-a", "team-c")) is None
    assert apart_verdict("team-b", True, [GPU0], shares, trusted("team-a")) is not None
    # The Pod's own binding must say so too.
    assert apart_verdict("team-b", False, [GPU0], shares, trusted("team-a", "team-c")) is not None


def test_placement_applies_the_rule_to_shares_only() -> None:
    node = node_facts(l40s("l40s-1", gpus=2).manifest())
    ledger = UsageLedger()
    ledger.upsert("team-a/p1", node.name, {GPU0: 4})
    tenancy = Tenancy(ledger.shares, never)
    share = binding()
    mine = binding_demand(share, {GPU0: 8}, "sha", "team-a")
    theirs = binding_demand(share, {GPU0: 8}, "sha", "team-b")
    assert check_nodes(mine, [node], ledger.used, tenancy)[0].fits  # type: ignore[union-attr]
    refused = check_nodes(theirs, [node], ledger.used, tenancy)[0]
    assert refused is not None and refused.code is NodeVerdictCode.OTHER_TENANT
    # Without the rule (no tenancy given) the same share fits: the bucket has room.
    assert check_nodes(theirs, [node], ledger.used)[0].fits  # type: ignore[union-attr]
    # The room figures see no room there for the other tenant.
    assert free_of(theirs, node, ledger.used(node.name), tenancy) == (0, 48)
    assert free_of(mine, node, ledger.used(node.name), tenancy) == (44, 48)
    # A whole GPU isolates: the rule has nothing to say about it.
    whole = gpu_binding("whole-amd64", cc="9.0")
    device = binding_demand(
        ExtendedResourceBinding.model_validate(whole), {"nvidia.com/gpu": 1}, "sha", "team-b"
    )
    assert device.shared == ()
    gpu_node = node_facts(h100("h100-1", gpus=2).manifest())
    ledger.upsert("team-a/p2", gpu_node.name, {GPU0: 4, "nvidia.com/gpu": 1})
    assert check_nodes(device, [gpu_node], ledger.used, tenancy)[0].fits  # type: ignore[union-attr]


def test_the_extender_remembers_a_shares_verdicts_per_tenant_and_trust() -> None:
    """Two tenants' demands with the same key and size are remembered apart, and a change of
    any tenant's profile (whom its shares may meet) forgets them; an isolating demand's are
    the same for every tenant."""
    owner = Owner()
    tenants = [Tenant(owner.settings(namespace=ns)) for ns in ("team-a", "team-b")]
    view = ClusterView(tenants[0].policy, ["*"], lambda: NOW, tenants=tenants)
    node = node_facts(l40s("l40s-1").manifest())
    view.replace_nodes([node])
    view.pod_changed("team-a/p1", (node.name, {GPU0: 8}))
    mine = binding_demand(binding(), {GPU0: 8}, "sha", "team-a")
    theirs = binding_demand(binding(), {GPU0: 8}, "sha", "team-b")
    assert mine.key == theirs.key
    assert view.cycle(mine) is view.cycle(mine)
    assert view.cycle(mine) is not view.cycle(theirs)
    (fits,) = view.verdicts(mine, [node.name], [node])
    assert fits is not None and fits.fits
    (refused,) = view.verdicts(theirs, [node.name], [node])
    assert refused is not None and refused.code is NodeVerdictCode.OTHER_TENANT
    remembered = view.cycle(theirs)
    envelope = share_envelope(owner, share_binding(acrossTenants=True), namespace="team-b")
    view.feeds["team-b"].profile_read(owner.sign(envelope, name=tenants[1].policy.bundle_configmap))
    assert view.cycle(theirs) is not remembered
    whole = ExtendedResourceBinding.model_validate(gpu_binding("whole-amd64"))
    device = [binding_demand(whole, {"nvidia.com/gpu": 1}, "sha", ns) for ns in ("a", "b")]
    assert view.cycle(device[0]) is view.cycle(device[1])


def test_room_figures_show_no_room_where_another_tenant_holds_the_gpu() -> None:
    owner = Owner()
    envelope = parse_envelope(
        share_envelope(owner, share_binding("share-0"), share_binding("share-1", GPU1),
                       namespace="team-b")
    )  # fmt: skip
    node = node_facts(l40s("l40s-1", gpus=2).manifest())
    ledger = UsageLedger()
    ledger.upsert("team-a/p1", node.name, {GPU0: 4})
    figures = figures_of(
        envelope, "0" * 64, [node], ledger.used, NOW, Tenancy(ledger.shares, never)
    )
    assert figures.largest == {"share-0": 0, "share-1": 48}


# -- the capacity replay -------------------------------------------------------------------------


def test_capacity_keeps_tenants_apart_and_says_who_holds_each_gpu() -> None:
    owner = Owner()
    bindings = [share_binding("share-0")]
    ctx = owner.state(share_envelope(owner, *bindings, namespace="kamiwaza")).context(NOW)
    nodes = [l40s(f"l40s-{i}").manifest() for i in range(2)]
    asks = request(inferenceResources=SHARE_BLOCK)
    deployments = [
        Deployment("a1", asks, "team-a"),
        Deployment("b1", asks, "team-b"),
        Deployment("a2", asks, "team-a"),
        Deployment("c1", asks, "team-c"),
    ]
    report = replay(deployments, nodes, ctx)
    placed = {p.name: p.node for p in report.placed}
    assert placed["a1"] == placed["a2"] != placed["b1"]
    (waiting,) = report.waiting
    assert (waiting.name, waiting.code) == ("c1", "other-tenant")
    held = {(h.node, h.resource): h for h in report.held}
    assert held[(placed["a1"], GPU0)].tenants == {"team-a": 16}
    assert held[(placed["b1"], GPU0)].tenants == {"team-b": 8}
    assert held[(placed["a1"], GPU0)].gpu == "0" and not held[(placed["a1"], GPU0)].isolates
    rows = report.to_json()["gpus"]
    assert {"node": placed["b1"], "resource": GPU0, "gpu": "0", "isolates": False,
            "tenants": {"team-b": 8}} in rows  # fmt: skip


def test_capacity_lets_tenants_share_where_the_profile_says_so() -> None:
    owner = Owner()
    trusting = share_binding("share-0", acrossTenants=True)
    ctx = owner.state(share_envelope(owner, trusting, namespace="kamiwaza")).context(NOW)
    asks = request(inferenceResources=SHARE_BLOCK)
    deployments = [Deployment("a1", asks, "team-a"), Deployment("b1", asks, "team-b")]
    report = replay(deployments, [l40s("l40s-0").manifest()], ctx)
    assert [p.node for p in report.placed] == ["l40s-0", "l40s-0"]
    (held,) = report.held
    assert held.tenants == {"team-a": 8, "team-b": 8}


# -- the controller's report ---------------------------------------------------------------------


def _verified_share(owner: Owner, namespace: str, **sharing: Any) -> tuple[Any, Any]:
    envelope = share_envelope(owner, share_binding(**sharing), namespace=namespace)
    state = owner.state(envelope, namespace=namespace)
    document = request(inferenceResources=SHARE_BLOCK)
    decision = state.decide(document, NOW)
    assert decision.allowed, decision.body
    pod = planned_pod("p1", document, decision.body, namespace=namespace)
    bind(pod, "l40s-1")
    profile = state.profile
    assert profile is not None
    return pod, {profile.sha256: profile}


VERIFIED_NOW = GrantVerdict("True", VERIFIED, "verified")


def test_the_controller_reports_a_share_beside_another_tenants() -> None:
    owner = Owner()
    pod, revisions = _verified_share(owner, "team-b")
    theirs = {GPU0: {"team-a": 4}}
    found = kept_apart(pod, VERIFIED_NOW, revisions, lambda node: theirs)
    assert (found.status, found.reason) == ("False", SHARED_WITH_ANOTHER_TENANT)
    assert "another tenant holds an accounted share on GPU 0" in found.message
    assert "node l40s-1" in found.message and "team-a" not in found.message
    # Verified before the other share came: it stays verified, and says why.
    copy_of = copy.deepcopy(pod)
    copy_of["status"]["conditions"].append(
        {"type": "kamiwaza.ai/AllocationVerified", "status": "True", "reason": VERIFIED}
    )
    sticky = kept_apart(copy_of, VERIFIED_NOW, revisions, lambda node: theirs)
    assert (sticky.status, sticky.reason) == ("True", VERIFIED_SHARED_WITH_ANOTHER_TENANT)
    # Its own tenant's shares, or another GPU's, are nothing to report.
    assert kept_apart(pod, VERIFIED_NOW, revisions, lambda node: {GPU0: {"team-b": 4}}) is (
        VERIFIED_NOW
    )
    assert kept_apart(pod, VERIFIED_NOW, revisions, lambda node: {GPU1: {"team-a": 4}}) is (
        VERIFIED_NOW
    )
    # Another verdict is left as it is.
    other = GrantVerdict("False", "ImageMismatch", "x")
    assert kept_apart(pod, other, revisions, lambda node: theirs) is other


def test_the_controller_leaves_a_share_whose_binding_crosses_tenants() -> None:
    owner = Owner()
    pod, revisions = _verified_share(owner, "team-b", acrossTenants=True)
    found = kept_apart(pod, VERIFIED_NOW, revisions, lambda node: {GPU0: {"team-a": 4}})
    assert found is VERIFIED_NOW
