"""The room figures from the nodes: how much of each device-plugin binding's resource is free on
the hardware the binding vouches for, as the extender judges it.

What the figures are, how they are read and how the webhook chooses a binding with them is the
planner's side (`inference_policy.planning.room`); this is the extender's side, which computes
them from what it knows of the nodes (`placement.free_of`: a GPU another tenant's share keeps
from this tenant's has no room) and publishes them into each tenant namespace. Pure: a function
of the node facts and a usage function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

from inference_policy.placing.nodes import NodeFacts
from inference_policy.placing.placement import Demand, binding_demand, free_of
from inference_policy.placing.tenancy import Tenancy
from inference_policy.planning.room import BindingRoom, RoomFigures
from inference_policy.trust.profile import Envelope, as_counted, format_timestamp


def figures_with(
    envelope: Envelope,
    bundle_sha256: str,
    frees: Callable[[Demand], Iterable[int | None]],
    now: datetime,
) -> RoomFigures:
    """Each device-plugin binding's free capacity, from `frees`: the free amount of a demand
    for each node it vouches for (None or 0: none there), as the extender judges a Pod of that
    binding in the envelope's namespace (`placement.free_of`: a GPU another tenant's share keeps
    from this tenant's has no room). Bindings whose class publishes no room are left out
    (`AllocationClass.room_published`): DRA claims spill through the scheduler. The extender
    hands in its remembered frees; `figures_of` computes them."""
    bindings: dict[str, BindingRoom] = {}
    for _, binding in envelope.gpu_bindings():
        if not binding.allocation.room_published or binding.id in bindings:
            continue
        counted = as_counted(binding)
        assert counted is not None
        demand = binding_demand(counted, {}, bundle_sha256, envelope.namespace)
        room = [free for free in frees(demand) if free]
        bindings[binding.id] = BindingRoom(free=sum(room), largestOnNode=max(room, default=0))
    return RoomFigures(
        schemaVersion=1,
        bundle=bundle_sha256,
        observedAt=format_timestamp(now),
        bindings=bindings,
    )


def figures_of(
    envelope: Envelope,
    bundle_sha256: str,
    nodes: Iterable[NodeFacts],
    used_of: Callable[[str], Mapping[str, int]],
    now: datetime,
    tenancy: Tenancy | None = None,
) -> RoomFigures:
    """`figures_with` over `nodes`, each node's use read from `used_of`, and its shares by
    tenant from `tenancy`."""
    listed = list(nodes)

    def frees(demand: Demand) -> Iterable[int | None]:
        return (free_of(demand, node, used_of(node.name), tenancy)[0] for node in listed)

    return figures_with(envelope, bundle_sha256, frees, now)


__all__ = ["figures_of", "figures_with"]
