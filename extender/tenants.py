"""The tenants one owner's extender places for: each namespace with its own trust and profile.

One owner release serves many tenant namespaces through one scheduler and one extender, and the
extender must account them together: two tenants on one node share its devices, so each Pod's
fit is judged against every tenant's Pods bound there. What differs per tenant is what its plan
is checked against: the namespace, the owner key(s) and cluster binding id its profile is signed
for, the profile's ConfigMap (or following revisions), the version floor, the recipe catalogs,
and the TenantAdmission holding its rollback record.

The first tenant is the flat settings (`--namespace`, `--owner-public-key`, ...); `--tenants`
(`TMI_TENANTS`, as the chart writes it) adds the others as a JSON array, each entry naming its
namespace and whatever differs from the first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated

from pydantic import Field, ValidationError

from inference_policy.base import strictjson
from inference_policy.base.strict import Strict
from policy_io.state import PolicySettings
from serving.settings import ConfigError

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
Name = Annotated[str, Field(min_length=1, max_length=253)]


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant namespace as the extender checks its Pods."""

    policy: PolicySettings
    rollback_record: str | None = None

    @property
    def namespace(self) -> str:
        return self.policy.namespace


class TenantEntry(Strict):
    """One element of `--tenants`; an absent field is the first tenant's."""

    namespace: Annotated[str, Field(pattern=DNS_LABEL)]
    bundleConfigMap: Name | None = None
    followRevisions: bool | None = None
    ownerPublicKey: Annotated[str, Field(min_length=1)] | None = None
    clusterBindingId: Name | None = None
    minimumBundleVersion: Annotated[int, Field(ge=1, le=2**53 - 1)] | None = None
    gpuRecipeCatalogConfigMap: Name | None = None
    cpuRecipeCatalogConfigMap: Name | None = None
    rollbackRecord: Name | None = None


def _tenant(entry: TenantEntry, first: Tenant) -> Tenant:
    base = first.policy
    keys = base.owner_public_keys
    if entry.ownerPublicKey is not None:
        keys = tuple(k.strip() for k in entry.ownerPublicKey.split(",") if k.strip())
    policy = replace(
        base,
        namespace=entry.namespace,
        bundle_configmap=entry.bundleConfigMap or base.bundle_configmap,
        follow_revisions=(
            base.follow_revisions if entry.followRevisions is None else entry.followRevisions
        ),
        owner_public_keys=keys,
        cluster_binding_id=entry.clusterBindingId or base.cluster_binding_id,
        minimum_bundle_version=entry.minimumBundleVersion or base.minimum_bundle_version,
        gpu_recipe_catalog_configmap=(
            entry.gpuRecipeCatalogConfigMap or base.gpu_recipe_catalog_configmap
        ),
        cpu_recipe_catalog_configmap=(
            entry.cpuRecipeCatalogConfigMap or base.cpu_recipe_catalog_configmap
        ),
    )
    return Tenant(policy, entry.rollbackRecord)


def parse_tenants(text: str | None, first: Tenant) -> tuple[Tenant, ...]:
    """Every tenant: `first`, then those `text` (the `--tenants` JSON) adds. Raises ConfigError
    naming the entry and field that cannot be used, or a namespace given twice."""
    tenants = [first]
    if text:
        try:
            document = strictjson.loads(text, what="--tenants")
        except strictjson.StrictJSONError as exc:
            raise ConfigError(str(exc)) from None
        if not isinstance(document, list):
            raise ConfigError("--tenants must be a JSON array of tenant objects")
        for index, item in enumerate(document):
            try:
                entry = TenantEntry.model_validate(item)
            except ValidationError as exc:
                problem = exc.errors()[0]
                where = ".".join(str(p) for p in problem["loc"]) or "entry"
                raise ConfigError(f"--tenants[{index}].{where}: {problem['msg']}") from None
            tenants.append(_tenant(entry, first))
    seen: set[str] = set()
    for tenant in tenants:
        if tenant.namespace in seen:
            raise ConfigError(f"--tenants: namespace {tenant.namespace!r} is given twice")
        seen.add(tenant.namespace)
    return tuple(tenants)


__all__ = ["Tenant", "TenantEntry", "parse_tenants"]
