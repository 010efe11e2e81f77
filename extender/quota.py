"""The owner's quota, held by the owner's extender: no engine Pod is placed that would take its
tenant past the quota the owner set (`inference_policy.placing.quota`).

The tenant's webhook and plan API refuse such a deployment first, with `quota-exceeded`, but
they are the tenant's software; and the native ResourceQuota the owner renders counts devices
per resource only. So before passing any node, the filter judges the Pod against its tenant's
quota (every limit: devices per resource and per binding, accounted VRAM, engine Pods) beside
what the namespace already holds, and a Pod that would pass a limit gets every node refused
with node verdict `quota`, naming the quota, the limit and what is held. Unresolvable on
purpose: preempting other Pods frees nothing of this tenant's quota.

What a namespace holds is every Pod bound there and not terminated, whatever its labels
(`serving.quota`: a Pod whose engine label was removed keeps its devices), plus the Pods this
extender passed in the last `hold_seconds` that its informer has not yet seen bound: the
scheduler binds a Pod after the filter answers, and the next Pod's filter may come first, so
without them two Pods could each pass a limit only one of them fits. A Pod held so counts once,
however often it is filtered again, and its hold goes when it is seen bound or the time passes.

Until both the quota and the Pods of a tenant have been read once, and while the API server
refuses the extender either read (its Role), the tenant's engine Pods are `Unconfirmed` (the
filter's `Error`: the scheduler retries them after its backoff); a quota object that cannot be
read places none of them (fail closed, the reason in their events).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from extender.owner_rights import Unconfirmed
from inference_policy.base.codes import NodeVerdictCode
from inference_policy.base.pod_view import PodView
from inference_policy.granting.pod_demand import Unplaceable
from inference_policy.placing.ledger import HOLDING_PODS_FIELD_SELECTOR
from inference_policy.placing.quota import Usage, combined, pod_usage
from serving.informer import Collection, Informer
from serving.quota import NewInformer, TenantQuota, quota_informers

HOLD_SECONDS = 30.0
PENDING = "quota"


def _identity(pod: Mapping[str, Any]) -> tuple[str, str]:
    view = PodView(pod)
    return view.namespace or "", view.name or ""


class QuotaBoard:
    """Each tenant namespace's quota and holdings, as the filter reads them (no call)."""

    def __init__(
        self,
        namespaces: Iterable[str],
        *,
        hold_seconds: float = HOLD_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tenants = {namespace: TenantQuota(namespace) for namespace in namespaces}
        self.hold_seconds = hold_seconds
        self.monotonic = monotonic
        # Pods passed by the filter and not yet seen bound: namespace -> name -> (usage, until).
        self._holds: dict[str, dict[str, tuple[Usage, float]]] = {ns: {} for ns in self.tenants}

    @property
    def pending(self) -> set[str]:
        """The tenant namespaces whose quota or Pods have not been read yet."""
        return {f"{PENDING}/{ns}" for ns, tenant in self.tenants.items() if not tenant.ready}

    def _passed(self, namespace: str, skip: str) -> Usage:
        """What the Pods the filter passed hold, those seen bound or too old dropped."""
        holds = self._holds[namespace]
        seen = self.tenants[namespace].usage
        now = self.monotonic()
        for name in [n for n, (_, until) in holds.items() if until < now or seen.get(n)]:
            del holds[name]
        return combined(usage for name, (usage, _) in holds.items() if name != skip)

    def check(self, pod: Mapping[str, Any]) -> None:
        """Nothing when the Pod fits its tenant's quota (or none is set); Unplaceable (node
        verdict `quota`) when it would pass a limit or the quota cannot be read; Unconfirmed
        before the tenant's quota and Pods have been read once."""
        namespace, name = _identity(pod)
        tenant = self.tenants.get(namespace)
        if tenant is None:
            return
        if not tenant.ready:
            raise Unconfirmed(f"the quota of namespace {namespace} has not been read yet")
        if tenant.refused_why is not None:
            # The owner's own Role: retried, as an RBAC change that has not reached the
            # authorizer yet heals by itself.
            raise Unconfirmed(f"namespace {namespace}: {tenant.refused_why}")
        if tenant.quota_why is not None:
            raise Unplaceable(
                f"namespace {namespace}: the owner's quota cannot be judged: "
                f"{tenant.quota_why}; no engine Pod is placed there until it can",
                NodeVerdictCode.QUOTA,
            )
        if tenant.quota is None:
            return
        refusal = tenant.refusal(pod_usage(pod), self._passed(namespace, name), skip=name)
        if refusal is not None:
            raise Unplaceable(refusal.reason, NodeVerdictCode.QUOTA)

    def passed(self, pod: Mapping[str, Any]) -> None:
        """The filter passed the Pod on some node: it counts as held until it is seen bound."""
        namespace, name = _identity(pod)
        tenant = self.tenants.get(namespace)
        if tenant is None or tenant.quota is None:
            return
        self._holds[namespace][name] = (pod_usage(pod), self.monotonic() + self.hold_seconds)

    def informers(self, new: NewInformer) -> list[Informer]:
        """Each tenant's quota object and bound Pods, from the API server."""
        out: list[Informer] = []
        for namespace, tenant in self.tenants.items():
            pods = Collection("pods", "Pod", namespace, field_selector=HOLDING_PODS_FIELD_SELECTOR)
            out.extend(quota_informers(tenant, new, pods))
        return out


__all__ = ["HOLD_SECONDS", "QuotaBoard"]
