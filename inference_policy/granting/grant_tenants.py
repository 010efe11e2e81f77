"""The allocation controller's side of keeping tenants apart: an engine Pod whose accounted share
sits on a physical GPU where another tenant's share sits too, when its own signed binding does
not let its shares be shared across tenants (`tenancy`).

Why the controller reports it although the extender refuses such a placement: a Pod can still
get there. The extender sees a Pod only once it is bound, and kube-scheduler binds
asynchronously, so two tenants' Pods scheduled a moment apart can race onto one GPU; a Pod bound
by another scheduler before the rule (an upgrade from a release without it) is there already.

Each tenant's controller holds its own Pods to its own profile, at the revision the plan names:
the other tenant's controller does the same for the other Pod by the other profile, so a GPU
shared where only one side trusts the other is reported on the side that does not. A Pod not yet
verified is reported False (`SharedWithAnotherTenant`): its readiness gate stays closed until it
is replaced, and the extender places the replacement on a GPU no other tenant holds. A Pod
verified before the other share came (or before this release) stays verified with
`VerifiedSharedWithAnotherTenant`, as a Pod whose authorization lapses does (`grant`): dropping a
healthy replica from its Service for what a neighbour did would be the neighbour's doing. Either
says "another tenant", never which.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from inference_policy.base.codes import (
    SHARED_WITH_ANOTHER_TENANT,
    VERIFIED,
    VERIFIED_SHARED_WITH_ANOTHER_TENANT,
)
from inference_policy.base.pod_view import PodView
from inference_policy.granting.grant import Lapse, Verdict, clip
from inference_policy.granting.stored_pod import read_plan, verified_before
from inference_policy.placing.tenancy import Shares, gpu_label, shared_units
from inference_policy.planning.plan import Plan, PlanError
from inference_policy.trust.profile import AnyBinding, VramPluginBinding
from inference_policy.trust.signing import VerifiedProfile


def _binding(plan: Plan, revisions: Mapping[str, VerifiedProfile | Lapse]) -> AnyBinding | None:
    profile = revisions.get(plan.bundle_sha256 or "")
    if not isinstance(profile, VerifiedProfile):
        return None
    found = profile.envelope.binding(plan.bindingId or "")
    return found[1] if found else None


def kept_apart(
    pod: Mapping[str, Any],
    verdict: Verdict,
    revisions: Mapping[str, VerifiedProfile | Lapse],
    shares_of: Callable[[str], Shares],
) -> Verdict:
    """`verdict` for a bound engine Pod, unless it is `Verified` and the Pod's share meets another
    tenant's on its GPU (`shares_of(node)`: each shared resource's holders by tenant) where its
    binding does not say `sharing.acrossTenants`."""
    view = PodView(pod)
    node = view.node_name
    plan = read_plan(pod)
    if verdict.reason != VERIFIED or node is None or isinstance(plan, str):
        return verdict
    try:
        granted = plan.request_units()
    except PlanError:
        return verdict
    shared = [name for name, _ in shared_units(granted)]
    if not shared:
        return verdict
    binding = _binding(plan, revisions)
    if isinstance(binding, VramPluginBinding) and binding.crosses_tenants:
        return verdict
    tenant = view.namespace or ""
    shares = shares_of(node)
    for resource in shared:
        if any(other != tenant for other in shares.get(resource, {})):
            return _reported(pod, plan, node, resource)
    return verdict


def _reported(pod: Mapping[str, Any], plan: Plan, node: str, resource: str) -> Verdict:
    said = (
        f"another tenant holds an accounted share on {gpu_label(resource)} of node {node}, "
        f"where this Pod holds one; an accounted share does not isolate tenants, and binding "
        f"{plan.bindingId} does not let its shares be shared across tenants "
        "(sharing.acrossTenants)"
    )
    if verified_before(pod):
        return Verdict(
            "True",
            VERIFIED_SHARED_WITH_ANOTHER_TENANT,
            clip(
                f"{said}. The Pod was verified before that share came and stays verified; "
                "replace it to have it placed on a GPU no other tenant holds"
            ),
        )
    return Verdict(
        "False",
        SHARED_WITH_ANOTHER_TENANT,
        clip(
            f"{said} (only another scheduler, or a bind racing the other tenant's, puts a Pod "
            "there). Delete the Pod; its replacement is placed on a GPU no other tenant holds"
        ),
    )


__all__ = ["kept_apart"]
