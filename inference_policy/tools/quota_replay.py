"""Tenant quotas in the capacity replay (`tmi capacity --quota`): which deployments each tenant's
quota admits, in order, and the headroom each tenant has left.

The tenant's webhook refuses, at create, an engine Pod that would take its namespace past the
owner's quota (`inference_policy.placing.quota`), counting every engine Pod of the namespace that
has not terminated, placed or Pending. The replay does the same before placing anything: each
deployment is planned as the webhook plans it, and one whose plan would pass a limit of its
tenant's quota (its namespace's: a Pod's own, else the profile's) is refused with the webhook's
status, code and message; the others are admitted, hold their plan's usage against the quota
whether or not a node then takes them, and go on to placement (`inference_policy.tools.capacity`).
Deployments the planner refuses, or external ones, pass through untouched for the replay to
report. Pure: plain values in, the admitted list and the headroom out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inference_policy.base.codes import RefusalCode
from inference_policy.placing.quota import Headroom, Quota, TenantUsage, check, headroom, plan_usage
from inference_policy.planning.decision import PlanContext
from inference_policy.planning.planner import GpuOptions, decide
from inference_policy.tools.capacity import Deployment, Refused


@dataclass(frozen=True)
class TenantHeadroom:
    """One tenant's quota after the replay: each limit, what the admitted deployments hold of
    it and what is left."""

    namespace: str
    quota: str
    items: list[Headroom]

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "quota": self.quota,
            "items": [item.to_json() for item in self.items],
        }


@dataclass(frozen=True)
class QuotaPass:
    admitted: list[Deployment] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)
    headroom: list[TenantHeadroom] = field(default_factory=list)


def within_quotas(
    deployments: Sequence[Deployment],
    ctx: PlanContext,
    quotas: Mapping[str, Quota],
    options: GpuOptions | None = None,
) -> QuotaPass:
    """The deployments each tenant's quota (`quotas`, by namespace) admits, in order, those it
    refuses, and every quota's headroom after them; `options` as `planner.decide` takes it."""
    profile = ctx.profile
    own = profile.envelope.namespace if profile is not None else ""
    held: dict[str, TenantUsage] = {namespace: TenantUsage() for namespace in quotas}
    out = QuotaPass()
    for index, deployment in enumerate(deployments):
        namespace = deployment.tenant or own
        quota = quotas.get(namespace)
        plan = decide(deployment.request, ctx, options).plan if quota is not None else None
        if quota is None or plan is None or not plan.local:
            out.admitted.append(deployment)
            continue
        usage = plan_usage(plan)
        refusal = check(quota, namespace, held[namespace].total(), usage)
        if refusal is not None:
            out.refused.append(
                Refused(deployment.name, 403, RefusalCode.QUOTA_EXCEEDED.value, refusal.message())
            )
            continue
        held[namespace].put(f"{index}/{deployment.name}", usage)
        out.admitted.append(deployment)
    for namespace, quota in sorted(quotas.items()):
        items = headroom(quota, held[namespace].total())
        out.headroom.append(TenantHeadroom(namespace, quota.name, items))
    return out


__all__ = ["QuotaPass", "TenantHeadroom", "within_quotas"]
