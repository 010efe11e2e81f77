"""The controller's `--tenants` (`TMI_TENANTS`): every tenant namespace one process serves, each
with its own trust and profile settings, checked once at start (`allocation_controller.tenants`).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from allocation_controller.__main__ import main
from allocation_controller.config import settings_from_args
from inference_policy.granting.owner_rights import CONTROLLER_RIGHTS, MAX_REVIEWS_PER_SECOND
from serving.settings import ConfigError

KEY_A, KEY_B = "A" * 43 + "=", "B" * 43 + "="
SHARED = {
    "TMI_IDENTITY": "me",
    "TMI_ENGINE_IMAGE_MAP": json.dumps({"vllm": "registry.example/vllm:1"}),
    "TMI_MAX_PROFILE_REVISIONS": "5",
}


def _tenant(namespace: str, **fields: Any) -> dict[str, Any]:
    return {"namespace": namespace, "ownerPublicKey": KEY_A, "clusterBindingId": "c1", **fields}


def _settings(tenants: Any, **env: str) -> Any:
    text = tenants if isinstance(tenants, str) else json.dumps(tenants)
    return settings_from_args([], {**SHARED, "TMI_TENANTS": text, **env})


def test_each_tenant_has_its_own_settings_and_shares_the_rest() -> None:
    settings = _settings(
        [
            _tenant("team-a"),
            _tenant(
                "team-b",
                ownerPublicKey=f"{KEY_A}, {KEY_B}",
                clusterBindingId="c2",
                bundleConfigMap="team-b-profile",
                followRevisions=True,
                minimumBundleVersion=4,
                gpuRecipeCatalogConfigMap="gpu-recipes",
                cpuRecipeCatalogConfigMap="cpu-recipes",
            ),
        ]
    )
    a, b = settings.every_tenant()
    assert settings.policy is a and settings.namespace == "team-a"
    assert (a.namespace, a.owner_public_keys, a.cluster_binding_id) == ("team-a", (KEY_A,), "c1")
    assert (a.minimum_bundle_version, a.follow_revisions) == (1, False)
    assert a.gpu_recipe_catalog_configmap is None
    assert b.namespace == "team-b"
    assert b.owner_public_keys == (KEY_A, KEY_B)
    assert (b.cluster_binding_id, b.bundle_configmap) == ("c2", "team-b-profile")
    assert (b.follow_revisions, b.minimum_bundle_version) == (True, 4)
    assert (b.gpu_recipe_catalog_configmap, b.cpu_recipe_catalog_configmap) == (
        "gpu-recipes",
        "cpu-recipes",
    )
    # The shared settings are every tenant's.
    for tenant in (a, b):
        assert tenant.engine_image_map == {"vllm": "registry.example/vllm:1"}
        assert tenant.max_profile_revisions == 5
        assert tenant.enabled
    # The Lease is the first tenant's namespace's unless told otherwise, as for one tenant.
    assert settings.lease_namespace == "team-a"
    assert settings.other_tenants == ()
    one = settings.for_tenant(b)
    assert (one.namespace, one.tenants, one.every_tenant()) == ("team-b", (), (b,))


def test_without_it_the_one_tenant_is_the_flat_settings() -> None:
    settings = settings_from_args(
        [],
        {
            **SHARED,
            "TMI_NAMESPACE": "kamiwaza",
            "TMI_OWNER_PUBLIC_KEY": KEY_A,
            "TMI_CLUSTER_BINDING_ID": "c1",
            "TMI_TENANT_NAMESPACES": "team-b",
        },
    )
    assert settings.tenants == ()
    (only,) = settings.every_tenant()
    assert only is settings.policy
    assert (only.namespace, only.owner_public_keys) == ("kamiwaza", (KEY_A,))
    assert settings.other_tenants == ("team-b",)


@pytest.mark.parametrize(
    ("tenants", "complaint"),
    [
        ("[{", r"--tenants is not JSON"),
        ('[{"namespace": "a", "namespace": "b"}]', r"--tenants is not JSON.*namespace"),
        ("{}", r"--tenants must be a JSON array"),
        ("[]", r"--tenants names no tenant"),
        ('["team-a"]', r"--tenants\[0\] must be a JSON object"),
        (
            [_tenant("team-a"), {"ownerPublicKey": KEY_A, "clusterBindingId": "c1"}],
            r"--tenants\[1\]\.namespace: Field required",
        ),
        (
            [_tenant("team-a"), _tenant("team-a")],
            r"--tenants\[1\] \(team-a\)\.namespace: 'team-a' is already tenant --tenants\[0\]",
        ),
        (
            [_tenant("team-a", ownerKey=KEY_B)],
            r"--tenants\[0\] \(team-a\)\.ownerKey: Extra inputs are not permitted",
        ),
        (
            [_tenant("team-a"), _tenant("team-b", webhookUrl="https://x")],
            r"--tenants\[1\] \(team-b\)\.webhookUrl: Extra inputs",
        ),
        (
            [_tenant("Team_A")],
            r"--tenants\[0\] \(Team_A\)\.namespace: String should match pattern",
        ),
        (
            [_tenant("team-a", minimumBundleVersion="4")],
            r"--tenants\[0\] \(team-a\)\.minimumBundleVersion: Input should be a valid integer",
        ),
        (
            [_tenant("team-a", minimumBundleVersion=0)],
            r"--tenants\[0\] \(team-a\)\.minimumBundleVersion: Input should be greater",
        ),
        (
            [_tenant("team-a", followRevisions="true")],
            r"--tenants\[0\] \(team-a\)\.followRevisions: Input should be a valid boolean",
        ),
        (
            [_tenant("team-a", gpuRecipeCatalogConfigMap="")],
            r"--tenants\[0\] \(team-a\)\.gpuRecipeCatalogConfigMap: String should have at least",
        ),
        (
            [{"namespace": "team-a", "clusterBindingId": "c1"}],
            r"--tenants\[0\] \(team-a\)\.ownerPublicKey is required",
        ),
        (
            [_tenant("team-a", ownerPublicKey=" , ")],
            r"--tenants\[0\] \(team-a\)\.ownerPublicKey is required",
        ),
        (
            [{"namespace": "team-a", "ownerPublicKey": KEY_A}],
            r"--tenants\[0\] \(team-a\)\.clusterBindingId is required",
        ),
    ],
)
def test_an_unusable_entry_is_refused_naming_the_tenant_and_the_field(
    tenants: Any, complaint: str
) -> None:
    with pytest.raises(ConfigError, match=complaint):
        _settings(tenants)


def test_with_tenant_mode_off_a_tenant_needs_no_key() -> None:
    settings = _settings([{"namespace": "team-a"}], TMI_ENABLED="false")
    assert settings.policy.owner_public_keys == () and not settings.policy.enabled


@pytest.mark.parametrize(
    ("variable", "flag"),
    [
        ("TMI_NAMESPACE", "--namespace"),
        ("TMI_OWNER_PUBLIC_KEY", "--owner-public-key"),
        ("TMI_CLUSTER_BINDING_ID", "--cluster-binding-id"),
        ("TMI_MINIMUM_BUNDLE_VERSION", "--minimum-bundle-version"),
        ("TMI_GPU_RECIPE_CATALOG_CONFIGMAP", "--gpu-recipe-catalog-configmap"),
        ("TMI_CPU_RECIPE_CATALOG_CONFIGMAP", "--cpu-recipe-catalog-configmap"),
        ("TMI_TENANT_NAMESPACES", "--tenant-namespaces"),
    ],
)
def test_a_flat_tenant_setting_beside_it_is_refused(variable: str, flag: str) -> None:
    """One tenant's flat setting beside --tenants would be silently one or the other."""
    with pytest.raises(ConfigError, match=f"{flag} cannot be given beside it"):
        _settings([_tenant("team-a")], **{variable: "2"})


def test_the_process_exits_2_on_a_bad_entry(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--tenants", json.dumps([_tenant("team-a", colour="blue")])])
    assert code == 2
    assert "--tenants[0] (team-a).colour" in capsys.readouterr().err


def test_with_many_tenants_each_reviews_its_rights_less_often() -> None:
    """Every tenant's controller reviews its rights in its namespace: the fleet's reviews
    together keep to the owner servers' rate, so each tenant's round spaces out."""
    one = _settings([_tenant("team-a")])
    assert one.for_tenant(one.policy).rights_seconds == 15.0
    many = _settings([_tenant(f"team-{i}") for i in range(100)])
    paced = many.for_tenant(many.policy).rights_seconds
    assert paced == 20.0
    assert 100 * len(CONTROLLER_RIGHTS) / paced <= MAX_REVIEWS_PER_SECOND
