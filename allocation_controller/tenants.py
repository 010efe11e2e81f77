"""The tenant namespaces one controller process serves, each with its own trust and profile.

Why: one Deployment and one Lease serve every tenant namespace of the owner release
(`allocation_controller.fleet`), so the process takes its tenants as one setting, `--tenants`
(`TMI_TENANTS`, as the chart writes it from `tmi.ownerTenants`): a JSON array with one object
per namespace, carrying what the owner decides for that tenant alone: the owner key(s) and
cluster binding id its profiles are signed for, its profile ConfigMap, whether it follows
revisions, its version floor and its recipe catalogs. What every tenant shares (the engine
image map, the registry relocation, the revision caps, whether tenant mode is on) stays in the
flat settings. Without `--tenants` the one tenant is the flat settings, as it always was.

Every entry is checked here, once, at start: an unknown key, a value of the wrong type, a
namespace missing or given twice, or (with tenant mode on) a tenant without a key or a binding
id is a `ConfigError` naming the entry, its namespace and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Annotated, Any

from pydantic import Field, ValidationError

from inference_policy.base import strictjson
from inference_policy.base.strict import Strict
from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME
from policy_io.state import PolicySettings
from serving.settings import ConfigError, split_list

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
Name = Annotated[str, Field(min_length=1, max_length=253)]
FLAG = "--tenants"


class TenantEntry(Strict):
    """One element of `--tenants`: exactly the per-tenant fields of the chart's
    `tmi.ownerTenants`; an absent optional field takes the server's default."""

    namespace: Annotated[str, Field(pattern=DNS_LABEL)]
    bundleConfigMap: Name = DEFAULT_CONFIGMAP_NAME
    followRevisions: bool = False
    ownerPublicKey: Annotated[str, Field(min_length=1)] | None = None
    clusterBindingId: Name | None = None
    minimumBundleVersion: Annotated[int, Field(ge=1, le=2**53 - 1)] = 1
    gpuRecipeCatalogConfigMap: Name | None = None
    cpuRecipeCatalogConfigMap: Name | None = None


def _where(index: int, item: Any) -> str:
    """`--tenants[1] (team-b)`: the entry, and its namespace where it names one."""
    namespace = item.get("namespace") if isinstance(item, Mapping) else None
    named = f" ({namespace})" if isinstance(namespace, str) and namespace else ""
    return f"{FLAG}[{index}]{named}"


def _tenant(entry: TenantEntry, shared: PolicySettings, where: str) -> PolicySettings:
    keys = split_list(entry.ownerPublicKey or "")
    if shared.enabled and not keys:
        raise ConfigError(f"{where}.ownerPublicKey is required (tenant mode is on)")
    if shared.enabled and not entry.clusterBindingId:
        raise ConfigError(f"{where}.clusterBindingId is required (tenant mode is on)")
    return replace(
        shared,
        namespace=entry.namespace,
        bundle_configmap=entry.bundleConfigMap,
        follow_revisions=entry.followRevisions,
        owner_public_keys=keys,
        cluster_binding_id=entry.clusterBindingId or "",
        minimum_bundle_version=entry.minimumBundleVersion,
        gpu_recipe_catalog_configmap=entry.gpuRecipeCatalogConfigMap,
        cpu_recipe_catalog_configmap=entry.cpuRecipeCatalogConfigMap,
    )


def parse_tenants(text: str, shared: PolicySettings) -> tuple[PolicySettings, ...]:
    """Each tenant of `text` (the `--tenants` JSON) as its policy settings: `shared` with the
    entry's own fields. Raises ConfigError naming the entry and the field that cannot be used."""
    try:
        document = strictjson.loads(text, what=FLAG)
    except strictjson.StrictJSONError as exc:
        raise ConfigError(f"{FLAG} is not JSON: {exc}") from None
    if not isinstance(document, list):
        raise ConfigError(f"{FLAG} must be a JSON array of tenant objects, one per namespace")
    if not document:
        raise ConfigError(f"{FLAG} names no tenant; give at least one, or leave it unset")
    tenants: list[PolicySettings] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(document):
        where = _where(index, item)
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where} must be a JSON object")
        try:
            entry = TenantEntry.model_validate(item)
        except ValidationError as exc:
            problem = exc.errors()[0]
            field = ".".join(str(p) for p in problem["loc"]) or "entry"
            raise ConfigError(f"{where}.{field}: {problem['msg']}") from None
        if entry.namespace in seen:
            raise ConfigError(
                f"{where}.namespace: {entry.namespace!r} is already tenant "
                f"{FLAG}[{seen[entry.namespace]}]; each namespace is one tenant"
            )
        seen[entry.namespace] = index
        tenants.append(_tenant(entry, shared, where))
    return tuple(tenants)


__all__ = ["TenantEntry", "parse_tenants"]
