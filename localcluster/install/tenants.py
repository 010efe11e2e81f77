"""A further tenant namespace served by a stack's owner release, as `owner.tenants` installs it.

`deploy_stack` brings up one tenant with the whole owner side; `add_tenant` adds a second
tenant the way an owner would: the tenant's own part installed in its namespace by its
installer, its profile (signed with its own owner key) published there, and the owner release
upgraded with the tenant in `owner.tenants`, which gives it its own TenantAdmission, policies,
webhook configuration and the allocation controller's Roles in its namespace, and puts it in
the settings of the one extender and the one allocation controller. The scheduler, the extender
and the controller stay one: the upgrade rolls the extender and the controller, which then
place and verify both tenants' Pods, the controller under its one Lease.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from localcluster.install.install import (
    INSTALLER,
    Rendered,
    grant_installer,
    render_owner,
    render_tenant,
)
from localcluster.install.stack import (
    WEBHOOK_DEPLOYMENT,
    TenantStack,
    _apply,
    _owner_applied,
    _wait_rbac,
)
from localcluster.install.stack_settings import StackSettings
from localcluster.plane.controlplane import HOST
from localcluster.plane.kube import JSON
from localcluster.plane.process import free_port
from localcluster.servers.admission_policies import policy_docs
from localcluster.servers.extender_process import LOCAL_FLAGS
from localcluster.servers.webhook import (
    CONFIGURATION_NAME,
    LocalWebhook,
    publish_profile,
    set_opt_in,
)


@dataclass
class FurtherTenant:
    """The second tenant's own server, its webhook; the owner's servers are the stack's."""

    settings: StackSettings
    webhook: LocalWebhook
    tenant: Rendered

    def stop(self) -> None:
        self.webhook.stop()


def _ours(doc: Mapping[str, Any], namespace: str) -> bool:
    """The further tenant's own policy objects: its parameters (the TenantAdmission named after
    the namespace, the TenantPolicy in it). The policies and bindings are the release's, bound
    once for every tenant namespace."""
    metadata = doc["metadata"]
    return bool(
        doc["kind"] == "CustomResourceDefinition"
        or metadata.get("namespace") == namespace
        or metadata["name"] == namespace
    )


def add_tenant(
    stack: TenantStack, settings: StackSettings, profile: Mapping[str, Any]
) -> FurtherTenant:
    """Install a further tenant ``settings.namespace`` beside ``stack``'s, with ``profile`` (its
    signed ConfigMap), and upgrade the owner part to serve it. Stop it before the stack."""
    assert stack.extender is not None and stack.controller is not None and stack.owner is not None
    plane, ns = stack.plane, settings.namespace
    owner_ns = stack.settings.scheduler_namespace
    configmap: JSON = copy.deepcopy(dict(profile))
    configmap["metadata"]["name"] = settings.bundle_configmap
    settings.verify(configmap)
    plane.create_namespace(ns)
    grant_installer(plane, ns)
    port = free_port()
    url = f"https://{HOST}:{port}/mutate"
    stack.further_tenants.append(
        {
            "namespace": ns,
            "ownerPublicKey": ",".join(settings.owner_public_keys),
            "clusterBindingId": settings.cluster_binding_id,
            "bundleConfigMap": settings.bundle_configmap,
            "webhook": {"url": url, "caBundle": plane.ca_bundle},
        }
    )
    tenant = render_tenant(settings.chart_values(webhook_url=url, ca_bundle=plane.ca_bundle), ns)
    owner = render_owner(stack.values(), owner_ns)
    _apply(stack, tenant.applied(), identity=INSTALLER)
    _apply(stack, _owner_applied(owner))
    publish_profile(plane, configmap)
    suffix = f"-{ns}"
    # What each server needs first in the new namespace, as for the first tenant.
    _wait_rbac(plane, replace(settings, scheduler_namespace=owner_ns))

    name = f"tmi-webhook{suffix}"
    directory = plane.workdir / name
    directory.mkdir(parents=True, exist_ok=True)
    webhook_settings = replace(
        settings.webhook_settings(),
        shipped_args=tuple(tenant.args(WEBHOOK_DEPLOYMENT, replace=LOCAL_FLAGS)),
        environment=tuple(tenant.environment(WEBHOOK_DEPLOYMENT, name).items()),
    )
    webhook = LocalWebhook(
        plane,
        webhook_settings,
        directory,
        port=port,
        identity=plane.service_account_identity(ns, WEBHOOK_DEPLOYMENT),
    )
    added = FurtherTenant(settings, webhook, tenant)
    try:
        webhook.start()
        set_opt_in(plane, ns, True)
        webhook.opted_in = True
        webhook.install_configuration(
            owner.get("MutatingWebhookConfiguration", f"{CONFIGURATION_NAME}{suffix}"),
            policies=[d for d in policy_docs(owner) if _ours(d, ns)],
        )
        # The owner's upgrade rolls the extender, whose settings now name the new tenant.
        stack.owner = owner
        stack.extender.install = owner
        stack.extender.restart()
        # ... and the one controller, whose settings now name the new namespace (the chart's
        # settings checksum rolls it), a replica at a time as the Deployment's rollout replaces
        # its Pods: it verifies the new tenant's Pods and holds each tenant's apart from the
        # other's accounted shares.
        stack.controller.set_install(owner)
        for index in range(len(stack.controller.replicas)):
            stack.controller.restart(index)
    except BaseException:
        added.stop()
        raise
    return added


__all__ = ["FurtherTenant", "add_tenant"]
