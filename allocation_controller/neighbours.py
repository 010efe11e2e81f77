"""The other tenants' accounted shares, which this tenant's engine Pods are held apart from.

Why: an accounted share does not isolate tenants, so a Pod of this tenant on a GPU where another
tenant's share sits is reported (`inference_policy.grant_tenants`), and only the other tenants'
bound Pods say where their shares sit. The owner release's controllers run under one
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
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from inference_policy.ledger import HOLDING_PODS_FIELD_SELECTOR, UsageLedger, holding_part, pod_key
from inference_policy.tenancy import Shares
from inference_policy.wire import ENGINE_LABEL
from serving.informer import Collection, Delta, Informer, ListWatch
from serving.kube import not_permitted

log = logging.getLogger(__name__)


class Neighbours:
    """The bound engine Pods of other tenant namespaces, as per-node shares by tenant."""

    def __init__(
        self,
        api: ListWatch,
        namespaces: Sequence[str],
        moved: Callable[[str], None],
        read: Callable[[], None],
        *,
        watch_timeout: int = 300,
    ) -> None:
        self.ledger = UsageLedger()
        self.moved = moved
        self.read = read
        self.refused: set[str] = set()
        self.informers = [
            Informer(
                api,
                Collection(
                    "pods",
                    "Pod",
                    namespace,
                    label_selector=ENGINE_LABEL,
                    field_selector=HOLDING_PODS_FIELD_SELECTOR,
                ),
                self._changed,
                watch_timeout=watch_timeout,
                on_listed=self._listed,
                on_error=self._failed(namespace),
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


__all__ = ["Neighbours"]
