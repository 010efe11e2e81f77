"""One tenant per non-isolating device: who holds accounted shares on each physical GPU, and the
rule that keeps tenants apart there.

Why: an accounted share (`allocation.ACCOUNTED_SHARE`, the owner's VRAM plugin) is bookkeeping
only. Every Pod with a share of a GPU runs on the whole card, time-sliced, with no memory
isolation between them (docs/sharing-evidence.md): one engine can exhaust the memory the other
was counting on, and each sees the other's processes and load. Within one tenant that is the
tenant's own business; across tenants it is a channel the owner has not vouched for. A whole
device or a MIG slice is handed out exclusively by the device plugin (or the DRA driver), so it
isolates (`AllocationClass.isolates`) and needs no rule here.

A physical GPU is a node and one non-isolating resource: the VRAM plugin advertises one bucket
per GPU (`kamiwaza.ai/vram-gb-gpu-<i>`), so `(node, resource)` names GPU `i` of the node.

The rule: a Pod of tenant T holding such a share goes on a GPU only where no other tenant holds
one, or where the owner lets both sides share: each tenant's signed profile says so for its own
share bindings (`sharing.acrossTenants`, default false), and the bindings of one resource agree
(`profile.Envelope`). The tenant is the Pod's namespace. Placement (`placement.check_nodes`,
`placement.free_of`), the capacity replay and the room figures apply it; the allocation
controller reports a Pod that finds itself on such a GPU all the same (`grant_tenants`).

Reasons say "another tenant", never which: tenants must not learn each other's names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from inference_policy.allocation import class_of_resource
from inference_policy.base.codes import NodeVerdictCode, Verdict, busy
from inference_policy.trust.profile import Envelope, VramPluginBinding


class Named(Protocol):
    """A node as placement holds it (`nodes.NodeFacts`): the rule reads only its name."""

    @property
    def name(self) -> str: ...


# resource -> tenant -> units of it the tenant's Pods hold, on one node.
Shares = Mapping[str, Mapping[str, int]]
# (tenant, resource) -> does the owner let that tenant's shares of the resource sit beside
# other tenants' on one GPU?
Crosses = Callable[[str, str], bool]

_GPU_INDEX = re.compile(r"-gpu-(?P<index>[0-9]+)$")
_EMPTY: Shares = {}


def shares_gpu(resource: str) -> bool:
    """Is `resource` a non-isolating class's (a share of one physical GPU, counted only)?"""
    allocation = class_of_resource(resource)
    return allocation is not None and not allocation.isolates


def shared_units(requests: Mapping[str, int]) -> Iterator[tuple[str, int]]:
    """The non-isolating resources among `requests`, with their units."""
    for name, units in requests.items():
        if units > 0 and shares_gpu(name):
            yield name, units


def gpu_index(resource: str) -> str | None:
    """The GPU index a per-GPU bucket names (`kamiwaza.ai/vram-gb-gpu-3`: "3"), else None."""
    found = _GPU_INDEX.search(resource)
    return found["index"] if found else None


def gpu_label(resource: str) -> str:
    """How a reason names the physical GPU of a bucket on the node it is given for."""
    index = gpu_index(resource)
    return f"GPU {index} ({resource})" if index is not None else f"the GPU of bucket {resource}"


def tenant_of(key: str) -> str:
    """The tenant of a ledger key (`namespace/name`, `ledger.pod_key`): its namespace."""
    return key.partition("/")[0]


class TenantShares:
    """Per node, the units of each non-isolating resource each tenant's Pods hold: the
    bookkeeping the rule reads, kept beside a usage ledger's totals and changed with them."""

    def __init__(self) -> None:
        self._nodes: dict[str, dict[str, dict[str, int]]] = {}
        # The node's shares, or None: a bound dict.get, so placement's pass over thousands of
        # candidates pays one C call for a node that holds none (`Tenancy.keep_apart`).
        self.get: Callable[[str], Shares | None] = self._nodes.get

    def change(self, node: str, tenant: str, requests: Mapping[str, int], sign: int) -> None:
        """Add (`sign` 1) or take back (-1) what one Pod of `tenant` holds on `node`."""
        shared = list(shared_units(requests))
        if not shared:
            return
        held = self._nodes.setdefault(node, {})
        for name, units in shared:
            tenants = held.setdefault(name, {})
            left = tenants.get(tenant, 0) + sign * units
            if left > 0:
                tenants[tenant] = left
            else:
                tenants.pop(tenant, None)
                if not tenants:
                    del held[name]
        if not held:
            del self._nodes[node]

    def of(self, node: str) -> Shares:
        return self._nodes.get(node) or _EMPTY

    def nodes(self) -> Iterable[str]:
        return self._nodes.keys()


@lru_cache(maxsize=256)
def refusal(resource: str) -> Verdict:
    """The verdict for a node where another tenant's share sits on `resource`'s GPU: one per
    resource (the reason names the GPU, not the node or the tenant), made once."""
    return busy(
        NodeVerdictCode.OTHER_TENANT,
        f"another tenant holds an accounted share on {gpu_label(resource)}; an accounted share "
        "does not isolate tenants, and the owner's profiles let one GPU be shared across "
        "tenants only where every tenant's share binding there says sharing.acrossTenants",
    )


def apart_verdict(
    tenant: str, crosses: bool, resources: Iterable[str], shares: Shares, others_cross: Crosses
) -> Verdict | None:
    """The rule for a share of `tenant` (`crosses`: its own binding lets it be shared across
    tenants) on one node's `resources`, given who holds shares there; None when it may go."""
    for resource in resources:
        holders = shares.get(resource)
        if not holders:
            continue
        others = [t for t in holders if t != tenant]
        if not others:
            continue
        if crosses and all(others_cross(t, resource) for t in others):
            continue
        return refusal(resource)
    return None


@dataclass(frozen=True, slots=True)
class Tenancy:
    """What placement reads to keep tenants apart: each node's shares by tenant (None or empty
    where it holds none), and whether the owner lets a tenant's shares of a resource be shared
    across tenants."""

    shares_of: Callable[[str], Shares | None]
    crosses: Crosses

    def verdict(
        self, tenant: str, own: bool, resources: Iterable[str], node: str
    ) -> Verdict | None:
        shares = self.shares_of(node)
        if not shares:
            return None
        return apart_verdict(tenant, own, resources, shares, self.crosses)

    def keep_apart(
        self,
        tenant: str,
        own: bool,
        resources: Sequence[str],
        nodes: Sequence[Named | None],
        verdicts: list[Verdict | None],
    ) -> None:
        """Replace, in `verdicts` (one per node), the fitting verdict of each node where the
        rule keeps the share off: a pass after placement's own, so its loop is unchanged. Most
        nodes hold no share, or only the tenant's own: a lookup or two each."""
        lookup = self.shares_of
        single = resources[0] if len(resources) == 1 else None
        for index, node in enumerate(nodes):
            verdict = verdicts[index]
            if node is None or verdict is None or not verdict.fits:
                continue
            held = lookup(node.name)
            if not held:
                continue
            if single is not None:
                holders = held.get(single)
                if not holders or (len(holders) == 1 and tenant in holders):
                    continue
                if not own:
                    verdicts[index] = refusal(single)
                    continue
            found = apart_verdict(tenant, own, resources, held, self.crosses)
            if found is not None:
                verdicts[index] = found


def crossing(envelope: Envelope | None) -> frozenset[str]:
    """The resources whose shares the profile lets sit beside other tenants' on one GPU."""
    if envelope is None:
        return frozenset()
    return frozenset(
        binding.resource.name
        for _, binding in envelope.gpu_bindings()
        if isinstance(binding, VramPluginBinding) and binding.crosses_tenants
    )


def holders(shares: Shares) -> list[tuple[str, list[str]]]:
    """Each shared resource of one node, with the tenants holding it, sorted: for reports."""
    return [(name, sorted(tenants)) for name, tenants in sorted(shares.items()) if tenants]


__all__ = [
    "Crosses",
    "Shares",
    "Tenancy",
    "TenantShares",
    "apart_verdict",
    "crossing",
    "gpu_index",
    "gpu_label",
    "holders",
    "refusal",
    "shared_units",
    "shares_gpu",
    "tenant_of",
]
