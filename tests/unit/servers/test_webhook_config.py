"""Webhook settings: flags, TMI_* variables, the downward-API namespace and their checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.settings import ConfigError
from webhook.config import settings_from_args

BASE = ["--cert", "c.pem", "--key", "k.pem"]


def test_environment_mirrors_the_helm_values(tmp_path: Path) -> None:
    image_map = tmp_path / "map.json"
    image_map.write_text(json.dumps({"a@sha256:" + "0" * 64: "b@sha256:" + "1" * 64}))
    env = {
        "TMI_ENABLED": "true",
        "TMI_BUNDLE_CONFIGMAP": "kamiwaza-inference-profiles-r2",
        "TMI_OWNER_PUBLIC_KEY": "old-key, new-key",
        "TMI_CLUSTER_BINDING_ID": "prod-1",
        "TMI_MINIMUM_BUNDLE_VERSION": "3",
        "TMI_ENGINE_IMAGE_MAP": str(image_map),
        "TMI_IMAGE_REGISTRY_PREFIX": "registry.example.com/kw",
        "TMI_AIRGAP_REGISTRY": "https://airgap.example.com",
        "TMI_GPU_RECIPE_CATALOG_CONFIGMAP": "gpu-cat",
        "TMI_CPU_RECIPE_CATALOG_CONFIGMAP": "cpu-cat",
        "TMI_GPU_REGISTRY_CREDENTIALS_SECRET": "gpu-pull",
        "TMI_CPU_REGISTRY_CREDENTIALS_SECRET": "cpu-pull",
        "TMI_SCHEDULER_NAME": "sched",
        "POD_NAMESPACE": "kamiwaza",
        "TMI_TLS_CERT": "/tls/tls.crt",
        "TMI_TLS_KEY": "/tls/tls.key",
        "TMI_PORT": "9443",
    }
    settings = settings_from_args([], env)
    policy = settings.policy
    assert policy.enabled is True
    assert policy.bundle_configmap == "kamiwaza-inference-profiles-r2"
    assert policy.owner_public_keys == ("old-key", "new-key")
    assert policy.cluster_binding_id == "prod-1"
    assert policy.minimum_bundle_version == 3
    assert policy.engine_image_map == {"a@sha256:" + "0" * 64: "b@sha256:" + "1" * 64}
    assert policy.image_registry_prefix == "registry.example.com/kw"
    assert policy.airgap_registry == "https://airgap.example.com"
    assert policy.gpu_recipe_catalog_configmap == "gpu-cat"
    assert policy.cpu_recipe_catalog_configmap == "cpu-cat"
    assert policy.gpu_registry_credentials_secret == "gpu-pull"
    assert policy.cpu_registry_credentials_secret == "cpu-pull"
    assert policy.scheduler_name == "sched"
    assert policy.namespace == "kamiwaza"
    assert (settings.cert_file, settings.key_file, settings.port) == (
        "/tls/tls.crt",
        "/tls/tls.key",
        9443,
    )
    assert settings.kubeconfig is None


def test_flags_win_and_keys_accumulate() -> None:
    env = {"TMI_NAMESPACE": "from-env", "TMI_ENABLED": "true", "TMI_SCHEDULER_NAME": "env"}
    settings = settings_from_args(
        [
            *BASE,
            "--namespace",
            "from-flag",
            "--no-enabled",
            "--owner-public-key",
            "k1,k2",
            "--owner-public-key",
            "k3",
            "--scheduler-name",
            "flag",
            "--engine-image-map",
            '{"x@sha256:' + "0" * 64 + '": "y@sha256:' + "1" * 64 + '"}',
        ],
        env,
    )
    assert settings.namespace == "from-flag"
    assert settings.policy.enabled is False
    assert settings.policy.owner_public_keys == ("k1", "k2", "k3")
    assert settings.policy.scheduler_name == "flag"
    assert settings.policy.engine_image_map is not None


def test_defaults_follow_the_chart() -> None:
    settings = settings_from_args([*BASE], {"POD_NAMESPACE": "kamiwaza"})
    assert settings.policy.enabled is False
    assert settings.policy.bundle_configmap == "kamiwaza-inference-profiles"
    assert settings.policy.minimum_bundle_version == 1
    assert settings.port == 8443
    assert settings.max_body_bytes == 4 * 1024 * 1024


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {"POD_NAMESPACE": "k"}, "--cert and --key"),
        (BASE, {}, "--namespace"),
        ([*BASE, "--namespace", "k", "--port", "70000"], {}, "--port: 70000 is outside"),
        ([*BASE, "--namespace", "k"], {"TMI_ENABLED": "maybe"}, "TMI_ENABLED: 'maybe'"),
        ([*BASE, "--namespace", "k", "--engine-image-map", "[1]"], {}, "must be a JSON object"),
        ([*BASE, "--namespace", "k", "--engine-image-map", "/nope.json"], {}, "cannot read"),
        ([*BASE, "--namespace", "k", "--minimum-bundle-version", "0"], {}, "outside 1.."),
        ([*BASE, "--namespace", "k", "--log-level", "loud"], {}, "--log-level"),
    ],
)
def test_unusable_settings_are_named(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        settings_from_args(argv, env)
