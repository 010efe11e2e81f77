"""The policy settings are assembled once (`serving.settings.Given.policy`): from the same flags
and variables the webhook, the extender and the allocation controller read the same values, and
refuse the same bad ones with the same words. Before, each server built them itself and the
checks had drifted (the controller read neither the profile ConfigMap's name nor the follow
switch; the extender named no POD_NAMESPACE fallback)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pytest

from allocation_controller.config import settings_from_args as controller_settings
from extender.config import settings_from_args as extender_settings
from serving.settings import ConfigError
from webhook.config import settings_from_args as webhook_settings

KEY = "A" * 43 + "="
ENV = {
    "TMI_ENABLED": "true",
    "TMI_NAMESPACE": "team-a",
    "TMI_OWNER_PUBLIC_KEY": KEY,
    "TMI_CLUSTER_BINDING_ID": "demo-cluster",
    "TMI_BUNDLE_CONFIGMAP": "team-a-profiles",
    "TMI_FOLLOW_PROFILE_REVISIONS": "true",
    "TMI_MINIMUM_BUNDLE_VERSION": "3",
    "TMI_ENGINE_IMAGE_MAP": '{"ghcr.io/a/b:1": "registry.local/a/b:1"}',
    "TMI_IMAGE_REGISTRY_PREFIX": "registry.local",
    "TMI_GPU_RECIPE_CATALOG_CONFIGMAP": "gpu-recipes",
    "TMI_MAX_PROFILE_REVISIONS": "8",
    "TMI_TLS_CERT": "/tls/tls.crt",
    "TMI_TLS_KEY": "/tls/tls.key",
    "TMI_IDENTITY": "me",
}
# What every server reads; the webhook's registry credentials and scheduler name are its own.
SHARED = (
    "enabled",
    "namespace",
    "bundle_configmap",
    "follow_revisions",
    "owner_public_keys",
    "cluster_binding_id",
    "minimum_bundle_version",
    "engine_image_map",
    "image_registry_prefix",
    "airgap_registry",
    "gpu_recipe_catalog_configmap",
    "cpu_recipe_catalog_configmap",
    "max_profile_revisions",
    "max_revision_bytes",
)
SERVERS: dict[str, Callable[[list[str], dict[str, str]], Any]] = {
    "webhook": webhook_settings,
    "extender": extender_settings,
    "controller": controller_settings,
}


def _policy(server: str, env: dict[str, str]) -> dict[str, Any]:
    policy = asdict(SERVERS[server]([], env).policy)
    return {field: policy[field] for field in SHARED}


def test_every_server_reads_the_same_policy_settings() -> None:
    webhook = _policy("webhook", ENV)
    assert webhook["namespace"] == "team-a" and webhook["follow_revisions"] is True
    assert webhook["minimum_bundle_version"] == 3 and webhook["max_profile_revisions"] == 8
    assert _policy("extender", ENV) == webhook
    assert _policy("controller", ENV) == webhook


def test_the_pods_own_namespace_stands_in_for_every_server() -> None:
    env = {k: v for k, v in ENV.items() if k != "TMI_NAMESPACE"} | {"POD_NAMESPACE": "team-b"}
    assert {_policy(server, env)["namespace"] for server in SERVERS} == {"team-b"}


@pytest.mark.parametrize("server", sorted(SERVERS))
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"TMI_MINIMUM_BUNDLE_VERSION": "2.5"}, "--minimum-bundle-version"),
        ({"TMI_ENGINE_IMAGE_MAP": "[1]"}, "--engine-image-map: the engine image map must be"),
        ({"TMI_MAX_PROFILE_REVISIONS": "0"}, "--max-profile-revisions"),
    ],
)
def test_a_bad_value_is_refused_alike_by_every_server(
    server: str, change: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        SERVERS[server]([], ENV | change)


@pytest.mark.parametrize("server", ["extender", "controller"])
def test_a_server_that_checks_grants_needs_the_owners_trust(server: str) -> None:
    env = {k: v for k, v in ENV.items() if k != "TMI_OWNER_PUBLIC_KEY"}
    with pytest.raises(ConfigError, match=r"--owner-public-key \(or TMI_OWNER_PUBLIC_KEY\)"):
        SERVERS[server]([], env)
