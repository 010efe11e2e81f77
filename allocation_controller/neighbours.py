"""The other tenants' accounted shares, which this tenant's engine Pods are held apart from.

Why: an accounted share does not isolate tenants, so a Pod of this tenant on a GPU where another
tenant's share sits is reported (`inference_policy.granting.grant_tenants`), and only the other
tenants' bound Pods say where their shares sit. The owner release's controllers run under one
ServiceAccount whose Role in every tenant namespace already lets it list and watch Pods there
(the chart's `tmi-allocation-controller` Role), so each controller reads the engine Pods of the
release's other tenant namespaces (`TMI_TENANT_NAMESPACES`) as the extender does: bound and not
terminated (`HOLDING_PODS_FIELD_SELECTOR`), each kept as its holding part, into a usage ledger
whose shares by tenant are what the verdict reads. A Pod of a namespace outside the release is
the extender's to count, not this controller's to see.

When a neighbour's Pod arrives on a node, leaves it or changes what it holds, `moved` is told
the node, so the Pods of this tenant there are checked again: a Pod reported because of a share
that has gone is verified again without waiting for its own next event. A list the API server
refuses (the Role gone from that namespace) counts as read, holding nothing, so the controller
is not kept unready by a namespace it cannot read; the informer lists again with backoff.

That is `Neighbours`, for a process serving one tenant (`TMI_TENANT_NAMESPACES`). A process that
serves every tenant (`allocation_controller.fleet`) already follows each tenant namespace's
engine Pods in that tenant's own controller, so a second watch per pair of tenants would only
repeat them: `Commons` is fed by every member's Pod informer instead (one watch per namespace
in all), keeps one ledger of every tenant's bound Pods, and tells each member of its
neighbours' moves and lists as `Neighbours` would. A member's Pod list refused counts as read
for the others, as a refused neighbour list does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from inference_policy.base.pod_view import PodView
from inference_policy.base.wire import ENGINE_LABEL
from inference_policy.granting.kept_pod import Skeleton
from inference_policy.placing.ledger import (
    HOLDING_PODS_FIELD_SELECTOR,
    UsageLedger,
    accounted_pod,
    holding_part,
    pod_key,
)
from inference_policy.placing.tenancy import Shares
from serving.informer import Collection, Delta, Informer, InformerFactory
from serving.kube import not_permitted

log = logging.getLogger(__name__)


class NeighbourView(Protocol):
    """What a tenant's controller reads of its neighbours: the informers it must run for them
    (none when another's run them), whether all have been read once, and a node's shares."""

    @property
    def informers(self) -> Sequence[Informer]: ...

    @property
    def synced(self) -> bool: ...

    def shares(self, node: str) -> Shares: ...


class Neighbours:
    """The bound engine Pods of other tenant namespaces, as per-node shares by tenant."""

    def __init__(
        self,
        new: InformerFactory,
        namespaces: Sequence[str],
        moved: Callable[[str], None],
        read: Callable[[], None],
    ) -> None:
        self.ledger = UsageLedger()
        self.moved = moved
        self.read = read
        self.refused: set[str] = set()
        self.informers = [
            new(
                Collection(
                    "pods",
                    "Pod",
                    namespace,
                    label_selector=ENGINE_LABEL,
                    field_selector=HOLDING_PODS_FIELD_SELECTOR,
                ),
                self._changed,
                self._listed,
                self._failed(namespace),
                transform=holding_part,
            )
            for namespace in namespaces
        ]

    @property
    def synced(self) -> bool:
        """Every other tenant namespace listed once, or refused to this controller."""
        return all(
            informer.synced.is_set() or informer.collection.namespace in self.refused
            for informer in self.informers
        )

    def shares(self, node: str) -> Shares:
        return self.ledger.shares(node)

    def _changed(self, delta: Delta) -> None:
        key = pod_key(delta.object)
        before, version = self.ledger.node_of(key), self.ledger.version
        self.ledger.apply(key, None if delta.type == "DELETED" else delta.object)
        if self.ledger.version == version:
            return
        for node in {before, self.ledger.node_of(key)}:
            if node is not None:
                self.moved(node)

    def _listed(self, informer: Informer) -> None:
        self.refused.discard(str(informer.collection.namespace))
        self.read()

    def _failed(self, namespace: str) -> Callable[[Exception], None]:
        def failed(exc: Exception) -> None:
            if not_permitted(exc) is not None and namespace not in self.refused:
                log.warning(
                    "cannot list the engine Pods of tenant namespace %s (%s); its shares are not "
                    "held apart from until it can",
                    namespace,
                    exc,
                )
                self.refused.add(namespace)
                self.read()

        return failed


def held(pod: Mapping[str, Any]) -> tuple[str, dict[str, int]] | None:
    """`(node, requests)` a kept Pod holds: a skeleton's as noted when it was cut, since it
    keeps no containers, and a whole Pod's read from it."""
    if isinstance(pod, Skeleton):
        return pod.held
    return accounted_pod(pod)


@dataclass
class _Member:
    moved: Callable[[str], None]
    read: Callable[[], None]
    # Has this member's own Pod list been read once, or refused to it?
    known: Callable[[], bool]


class Commons:
    """Every fleet member's bound engine Pods, from the members' own Pod informers, as per-node
    shares by tenant; each member sees the others as its neighbours."""

    def __init__(self) -> None:
        self.ledger = UsageLedger()
        self._members: dict[str, _Member] = {}

    def join(
        self,
        namespace: str,
        moved: Callable[[str], None],
        read: Callable[[], None],
        known: Callable[[], bool],
    ) -> SharedNeighbours:
        """Make `namespace` a member: told `moved(node)` when another member's Pod arrives on or
        leaves a node, `read()` when another member's Pods are read (or refused)."""
        if namespace in self._members:
            raise ValueError(f"tenant namespace {namespace!r} has joined already")
        self._members[namespace] = _Member(moved, read, known)
        return SharedNeighbours(self, namespace)

    def _others(self, namespace: str) -> list[_Member]:
        return [member for name, member in self._members.items() if name != namespace]

    def synced_for(self, namespace: str) -> bool:
        return all(member.known() for member in self._others(namespace))

    def seen(self, namespace: str, delta: Delta) -> None:
        """A delta of `namespace`'s Pod informer (its engine Pods, bound or not)."""
        name = str(PodView(delta.object).name)
        key = f"{namespace}/{name}"
        before, version = self.ledger.node_of(key), self.ledger.version
        holding = None if delta.type == "DELETED" else held(delta.object)
        if holding is None:
            self.ledger.remove(key)
        else:
            self.ledger.upsert(key, *holding)
        if self.ledger.version == version:
            return
        nodes = {node for node in (before, self.ledger.node_of(key)) if node is not None}
        for member in self._others(namespace):
            for node in nodes:
                member.moved(node)

    def read(self, namespace: str) -> None:
        """`namespace`'s Pods were listed, or the list was refused: the others may be synced."""
        for member in self._others(namespace):
            member.read()


class SharedNeighbours:
    """One member's view of `Commons`: no informers of its own, the others' shares."""

    informers: Sequence[Informer] = ()

    def __init__(self, commons: Commons, namespace: str) -> None:
        self.commons = commons
        self.namespace = namespace

    @property
    def synced(self) -> bool:
        return self.commons.synced_for(self.namespace)

    def shares(self, node: str) -> Shares:
        return self.commons.ledger.shares(node)


__all__ = ["Commons", "NeighbourView", "Neighbours", "SharedNeighbours", "held"]
