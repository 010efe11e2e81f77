"""One tenant namespace's quota and what its Pods hold, kept current by two informers: the same
in the tenant's webhook (the early refusal) and the owner's extender (the guarantee).

The quota is the owner's ResourceQuota `tmi-quota` (`inference_policy.placing.quota`), read by name,
so a Role can name it (`resourceNames`); absent, the tenant has no quota. What the namespace's Pods
hold is `inference_policy.placing.quota.pod_usage` of each Pod the server's collection selects (the
webhook: its engine Pods that have not terminated, Pending ones included, as the native quota
counts them; the extender: every Pod bound there and not terminated, whatever its labels, since
a Pod whose engine label was removed still holds its devices). An informer keeps of each Pod
only its identity and that usage, so a namespace of many Pods costs a few hundred bytes each.

A read the API server refuses to the server's Role is kept as why (`unreadable`), as is a quota
object that cannot be read; each server decides what that means for its answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from inference_policy.base.pod_view import ObjectView
from inference_policy.placing.quota import (
    QUOTA_NAME,
    Quota,
    QuotaError,
    Refusal,
    TenantUsage,
    Usage,
    check,
    combined,
    parse_quota,
    pod_usage,
    usage_from_json,
)
from serving.informer import JSON, Collection, Delta, Informer
from serving.kube import not_permitted

NewInformer = Callable[
    [Collection, Callable[[Delta], None], Callable[[Informer], None], Callable[[Exception], None]],
    Informer,
]
USAGE_KEY = "usage"
_KEPT_METADATA = ("name", "namespace", "uid", "resourceVersion")


def usage_part(pod: JSON) -> JSON:
    """What an informer keeps of a Pod: its identity (name, uid, resourceVersion) and its
    usage, computed once as it arrives."""
    meta = pod.get("metadata")
    kept: JSON = {"apiVersion": pod.get("apiVersion", "v1"), "kind": pod.get("kind", "Pod")}
    if isinstance(meta, dict):
        kept["metadata"] = {key: meta[key] for key in _KEPT_METADATA if key in meta}
    # Only what it holds: most Pods of a namespace hold nothing, and each kept dict costs.
    usage = {key: value for key, value in pod_usage(pod).to_json().items() if value}
    if usage:
        kept[USAGE_KEY] = usage
    return kept


def _usage_of(kept: JSON) -> Usage:
    found = kept.get(USAGE_KEY)
    if isinstance(found, Mapping):
        return usage_from_json(found)
    # Kept without usage (it holds nothing), or a whole Pod handed in directly.
    return pod_usage(kept)


def _name(obj: JSON) -> str:
    return ObjectView(obj).name or ""


class TenantQuota:
    """The quota of one namespace as last read, and what its Pods hold."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.quota: Quota | None = None
        # Why the quota object cannot be read (it is malformed), and why a read of it or of the
        # Pods was refused (the server's Role); None when neither.
        self.quota_why: str | None = None
        self.refused_why: str | None = None
        self._quota_refused: str | None = None
        self._pods_refused: str | None = None
        self.usage = TenantUsage()
        self.quota_read = False
        self.pods_read = False

    @property
    def unreadable(self) -> str | None:
        """Why the namespace's quota cannot be judged now, or None."""
        return self.quota_why or self.refused_why

    def _refused(self) -> None:
        self.refused_why = self._quota_refused or self._pods_refused

    @property
    def ready(self) -> bool:
        """Both have been read once (a refused read counts: it is an answer)."""
        return self.quota_read and self.pods_read

    def quota_changed(self, obj: Mapping[str, Any] | None, why: str | None = None) -> None:
        """The ResourceQuota as a list or watch found it (None: absent, or `why` not read)."""
        self.quota_read = True
        self._quota_refused = None if why is None else f"ResourceQuota {QUOTA_NAME} {why}"
        self._refused()
        if why is not None:
            self.quota, self.quota_why = None, None
            return
        if obj is None:
            self.quota, self.quota_why = None, None
            return
        try:
            self.quota, self.quota_why = parse_quota(obj), None
        except QuotaError as exc:
            self.quota, self.quota_why = None, str(exc)

    def pods_listed(self, pods: Mapping[str, JSON]) -> None:
        self.usage.replace((name, _usage_of(kept)) for name, kept in pods.items())
        self.pods_read, self._pods_refused = True, None
        self._refused()

    def pods_refused(self, why: str) -> None:
        """The list of the Pods was refused: what they hold is not known (never nothing)."""
        self.pods_read, self._pods_refused = True, f"the Pods of namespace {self.namespace} {why}"
        self._refused()

    def pod_changed(self, name: str, kept: JSON | None) -> None:
        self.usage.put(name, None if kept is None else _usage_of(kept))

    def refusal(self, asked: Usage, also: Usage | None = None, skip: str = "") -> Refusal | None:
        """The quota's refusal of one more Pod asking `asked`, beside what the namespace's Pods
        hold (less Pod `skip`'s own entry) and `also` (Pods counted elsewhere); None when it
        fits or no quota is known."""
        held = self.usage.total()
        own = self.usage.get(skip) if skip else None
        if own is not None:
            held = combined((held, _negated(own)))
        if also is not None:
            held = combined((held, also))
        return check(self.quota, self.namespace, held, asked)


def _negated(usage: Usage) -> Usage:
    return Usage(
        {k: -v for k, v in usage.devices.items()},
        {k: -v for k, v in usage.bindings.items()},
        -usage.vram_gb,
        -usage.engine_pods,
    )


def quota_informers(state: TenantQuota, new: NewInformer, pods: Collection) -> list[Informer]:
    """The quota object's informer (by name) and the Pods' (`pods`, the server's selection),
    feeding `state`."""

    def quota_changed(delta: Delta) -> None:
        if not delta.listed:
            state.quota_changed(None if delta.type == "DELETED" else delta.object)

    def quota_listed(informer: Informer) -> None:
        state.quota_changed(informer.store.get(QUOTA_NAME))

    def quota_failed(exc: Exception) -> None:
        why = not_permitted(exc)
        if why is not None:
            state.quota_changed(None, why)

    quotas = Collection(
        "resourcequotas",
        "ResourceQuota",
        state.namespace,
        field_selector=f"metadata.name={QUOTA_NAME}",
    )

    def pod_changed(delta: Delta) -> None:
        if not delta.listed:
            gone = delta.type == "DELETED"
            state.pod_changed(_name(delta.object), None if gone else delta.object)

    def pods_listed(informer: Informer) -> None:
        state.pods_listed({name: informer.store.get(name) or {} for name in informer.store})

    def pods_failed(exc: Exception) -> None:
        # No Pods to count is no usage known: kept as refused, never as nothing held.
        why = not_permitted(exc)
        if why is not None:
            state.pods_refused(why)

    pod_informer = new(pods, pod_changed, pods_listed, pods_failed)
    pod_informer.transform = usage_part
    return [new(quotas, quota_changed, quota_listed, quota_failed), pod_informer]


__all__ = ["USAGE_KEY", "NewInformer", "TenantQuota", "quota_informers", "usage_part"]
