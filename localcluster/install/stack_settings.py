"""What the owner configures once for every server of a local stack: trust, binding id, names,
timings; and how those become the chart's values, the webhook's settings and a verified profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from inference_policy.placing.schedconfig import DEFAULT_SCHEDULER_NAME, DEFAULT_SCHEDULER_NAMESPACE
from inference_policy.trust.signing import (
    TrustedKeys,
    VerifiedProfile,
    VerifyPolicy,
    verify_configmap,
)
from localcluster.install.install import chart_values
from localcluster.servers.webhook import DEFAULT_BUNDLE_CONFIGMAP, WebhookSettings

# The tenant namespace and profile ConfigMap name the shipped manifests are written for.
SHIPPED_NAMESPACE = "kamiwaza"
SHIPPED_BUNDLE_CONFIGMAP = DEFAULT_BUNDLE_CONFIGMAP


@dataclass(frozen=True)
class StackSettings:
    """What the owner configures once for every server: trust, binding id, names, timings."""

    owner_public_keys: tuple[str, ...]
    cluster_binding_id: str
    namespace: str = SHIPPED_NAMESPACE
    bundle_configmap: str = SHIPPED_BUNDLE_CONFIGMAP
    # The chart's core.inferenceResources.followRevisions: follow the newest signed revision.
    follow_revisions: bool = False
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    scheduler_namespace: str = DEFAULT_SCHEDULER_NAMESPACE
    scheduling_timeout_seconds: float = 300.0
    controller_replicas: int = 2
    # The shipped defaults (15/10/2 s, 4 s per API call): a clean shutdown releases the Lease,
    # so a stopped leader is replaced within one retry period anyway.
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    runtime_classes: tuple[str, ...] = ("nvidia",)
    log_level: str = "INFO"
    # The chart's core.inferenceResources.engineImageMap (catalog reference -> mirror), as
    # pairs; the real node maps every engine to the image it has imported.
    engine_image_map: tuple[tuple[str, str], ...] = ()
    # The chart's owner.admissionPolicies.enabled; False is the fallback for releases before 1.36.
    admission_policies: bool = True

    def chart_values(self, **extra: Any) -> dict[str, Any]:
        """The values file an owner and a tenant would install the chart with."""
        return chart_values(
            owner_public_keys=self.owner_public_keys,
            cluster_binding_id=self.cluster_binding_id,
            bundle_configmap=self.bundle_configmap,
            scheduler_name=self.scheduler_name,
            tenant_namespace=self.namespace,
            scheduling_timeout_seconds=self.scheduling_timeout_seconds,
            log_level=self.log_level,
            follow_revisions=self.follow_revisions,
            engine_image_map=dict(self.engine_image_map) or None,
            admission_policies=self.admission_policies,
            **extra,
        )

    def webhook_settings(self) -> WebhookSettings:
        return WebhookSettings(
            owner_public_keys=self.owner_public_keys,
            cluster_binding_id=self.cluster_binding_id,
            namespace=self.namespace,
            bundle_configmap=self.bundle_configmap,
            scheduler_name=self.scheduler_name,
        )

    def verify(self, configmap: Mapping[str, Any], now: datetime | None = None) -> VerifiedProfile:
        """The profile as every server will verify it (raises ProfileRefused otherwise)."""
        policy = VerifyPolicy(
            trusted=TrustedKeys.from_base64(self.owner_public_keys),
            cluster_binding_id=self.cluster_binding_id,
            namespace=self.namespace,
            configmap_name=self.bundle_configmap,
        )
        return verify_configmap(dict(configmap), policy, now or datetime.now(UTC))


__all__ = ["SHIPPED_BUNDLE_CONFIGMAP", "SHIPPED_NAMESPACE", "StackSettings"]
