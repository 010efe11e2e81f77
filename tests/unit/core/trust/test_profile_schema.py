"""The envelope schema refuses everything the seed rules out, naming the field."""

from __future__ import annotations

from typing import Any, cast

import pytest

from inference_policy.trust.profile import ProfileSchemaError, parse_envelope, parse_timestamp
from kits.profilekit import Owner, clone

OWNER = Owner()
BASE = OWNER.envelope()


def whole(env: dict[str, Any]) -> dict[str, Any]:
    return cast(dict[str, Any], env["profiles"][1]["bindings"][0])


def refused(env: dict[str, Any]) -> str:
    with pytest.raises(ProfileSchemaError) as err:
        parse_envelope(env)
    return str(err.value)


def test_template_parses() -> None:
    envelope = parse_envelope(clone(BASE))
    assert [p.name for p in envelope.profiles] == [
        "cpu-standard",
        "nvidia-whole",
        "nvidia-mig-3g40gb",
        "nvidia-vram-share",
    ]


def test_unknown_top_level_key() -> None:
    env = clone(BASE)
    env["extra"] = 1
    assert refused(env) == "extra: unknown field"


def test_unknown_nested_key() -> None:
    env = clone(BASE)
    whole(env)["accelerator"]["driverVersion"] = "580"
    assert refused(env) == "profiles[1].bindings[0].accelerator.driverVersion: unknown field"


def test_fractional_usable_memory() -> None:
    env = clone(BASE)
    whole(env)["capacity"]["usableMemory"] = "121.7Gi"
    message = refused(env)
    assert message.startswith("profiles[1].bindings[0].capacity.usableMemory:")
    assert "not a whole number of Gi, Mi or Ki" in message


@pytest.mark.parametrize("value", ["79G", "79", "0Gi", "79gi", "79 Gi", "1Ti"])
def test_usable_memory_units(value: str) -> None:
    env = clone(BASE)
    whole(env)["capacity"]["usableMemory"] = value
    assert "capacity.usableMemory" in refused(env)


@pytest.mark.parametrize("value", ["79Gi", "80896Mi", "82837504Ki"])
def test_usable_memory_whole_units_accepted(value: str) -> None:
    env = clone(BASE)
    whole(env)["capacity"]["usableMemory"] = value
    parse_envelope(env)


def test_node_selector_other_key() -> None:
    env = clone(BASE)
    whole(env)["nodeSelector"]["kubernetes.io/hostname"] = "gpu-1"
    message = refused(env)
    assert message.startswith("profiles[1].bindings[0].nodeSelector:")
    assert "only kubernetes.io/arch is accepted; remove kubernetes.io/hostname" in message


def test_node_selector_must_match_architecture() -> None:
    env = clone(BASE)
    whole(env)["nodeSelector"]["kubernetes.io/arch"] = "arm64"
    assert "does not match architecture amd64" in refused(env)


def test_binding_id_repeated_across_profiles() -> None:
    env = clone(BASE)
    env["profiles"][2]["bindings"][0]["id"] = whole(env)["id"]
    message = refused(env)
    assert "profiles[2].bindings[0].id 'nvidia-whole-amd64' repeats profiles[1].bindings[0].id" in (
        message
    )


def test_binding_id_repeated_within_profile() -> None:
    env = clone(BASE)
    env["profiles"][1]["bindings"].append(clone(whole(env)))
    assert "binding ids must be unique across the whole envelope" in refused(env)


def test_variant_outside_compatible_ids() -> None:
    env = clone(BASE)
    whole(env)["runtime"]["variantId"] = "llamacpp-nvidia-arm64"
    message = refused(env)
    assert "runtime.variantId 'llamacpp-nvidia-arm64' is not in this profile's" in message
    assert message.startswith("profiles[1]:")


@pytest.mark.parametrize("value", ["", "-abc", ".x", "a" * 129, "has space", "slash/no", "ünicode"])
def test_cluster_binding_id_rule_refuses(value: str) -> None:
    env = clone(BASE)
    env["clusterBindingId"] = value
    assert refused(env).startswith("clusterBindingId:")


@pytest.mark.parametrize("value", ["a", "9", "A" * 128, "prod.us-east_1:gpu-a", "x-"])
def test_cluster_binding_id_rule_accepts(value: str) -> None:
    env = clone(BASE)
    env["clusterBindingId"] = value
    assert parse_envelope(env).clusterBindingId == value


@pytest.mark.parametrize("value", [10, 100, 0, "13", 13.0, True])
def test_cuda_driver_major_range(value: object) -> None:
    env = clone(BASE)
    whole(env)["accelerator"]["cudaDriverMajor"] = value
    assert "profiles[1].bindings[0].accelerator.cudaDriverMajor" in refused(env)


@pytest.mark.parametrize("value", [11, 99])
def test_cuda_driver_major_bounds_accepted(value: int) -> None:
    env = clone(BASE)
    whole(env)["accelerator"]["cudaDriverMajor"] = value
    parse_envelope(env)


@pytest.mark.parametrize(
    "value",
    [
        "2026-10-01T00:00:00",
        "2026-10-01T00:00:00+00:00",
        "2026-10-01T00:00:00.5Z",
        "2026-10-01t00:00:00z",
        "2026-10-01",
        "2026-13-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
    ],
)
@pytest.mark.parametrize("field", ["issuedAt", "expiresAt"])
def test_timestamps(field: str, value: str) -> None:
    env = clone(BASE)
    env[field] = value
    assert refused(env).startswith(f"{field}:")


def test_timestamp_parse() -> None:
    assert parse_timestamp("2026-10-01T00:00:00Z").isoformat() == "2026-10-01T00:00:00+00:00"


@pytest.mark.parametrize("value", [0, -1, 2**53, "1", 1.0, True])
def test_version_must_be_positive_safe_integer(value: object) -> None:
    env = clone(BASE)
    env["version"] = value
    assert refused(env).startswith("version:")


def test_schema_version() -> None:
    env = clone(BASE)
    env["schemaVersion"] = 2
    assert refused(env).startswith("schemaVersion:")


def test_key_id_format() -> None:
    env = clone(BASE)
    env["keyId"] = "sha256:" + "A" * 64
    assert refused(env).startswith("keyId:")


def test_image_must_be_digest_pinned() -> None:
    env = clone(BASE)
    whole(env)["runtime"]["image"] = "ghcr.io/x/llamacpp:latest"
    assert "profiles[1].bindings[0].runtime.image" in refused(env)


def test_unknown_feature() -> None:
    env = clone(BASE)
    whole(env)["accelerator"]["features"] = ["bf16", "tf32"]
    assert "accelerator.features[1]" in refused(env)


def test_duplicate_feature() -> None:
    env = clone(BASE)
    whole(env)["accelerator"]["features"] = ["bf16", "bf16"]
    assert "feature 'bf16' is listed twice" in refused(env)


def test_unknown_allocator() -> None:
    env = clone(BASE)
    whole(env)["allocator"] = "dra"
    assert "profiles[1].bindings[0]" in refused(env)


def test_gpu_binding_needs_usable_memory() -> None:
    env = clone(BASE)
    del whole(env)["capacity"]["usableMemory"]
    assert "usableMemory is required" in refused(env)


def test_mig_binding_in_whole_device_profile() -> None:
    env = clone(BASE)
    whole(env)["resource"]["name"] = "nvidia.com/mig-3g.40gb"
    assert "a mig binding in a profile that guarantees whole-device" in refused(env)


def test_vram_plugin_resource_name() -> None:
    env = clone(BASE)
    env["profiles"][3]["bindings"][0]["resource"]["name"] = "nvidia.com/gpu"
    assert "must be a kamiwaza.ai/vram-gb-* resource" in refused(env)


def test_cpu_profile_rejects_gpu_binding() -> None:
    env = clone(BASE)
    env["profiles"][0]["bindings"].append(clone(whole(env)))
    assert refused(env)


def test_amd_binding_schema() -> None:
    env = clone(BASE)
    binding = whole(env)
    binding["accelerator"] = {"vendor": "amd", "features": []}
    binding["resource"]["name"] = "amd.com/gpu"
    binding["runtime"]["kind"] = "rocm"
    binding["runtime"]["variantId"] = "llamacpp-nvidia-amd64"
    parse_envelope(env)
    binding["accelerator"]["cudaDriverMajor"] = 13
    assert "cudaDriverMajor applies only to nvidia" in refused(env)


def test_not_an_object() -> None:
    with pytest.raises(ProfileSchemaError, match="must be a JSON object"):
        parse_envelope([1])


def test_duplicate_profile_name() -> None:
    env = clone(BASE)
    env["profiles"][2]["name"] = "nvidia-whole"
    assert "profiles[2].name 'nvidia-whole' is used twice" in refused(env)
