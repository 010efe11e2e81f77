"""The planner: every rule and every refusal text of the seed and the contract."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from inference_policy.base.quantity import GI, MI
from inference_policy.planning.planner import decide
from inference_policy.planning.recipes import parse_catalog
from inference_policy.planning.sizing import estimate_gpu, kv_cache_bytes
from inference_policy.trust.signing import DIGEST_KEY
from kits.profilekit import (
    DELETE,
    NOW,
    Owner,
    catalog_image,
    gpu_binding,
    gpu_profile,
    request,
    with_profiles,
)
from policy_io.catalog import packaged_catalog
from policy_io.feed import PolicyFeed
from policy_io.offline import snapshot_of
from policy_io.snapshot import PolicySnapshot
from policy_io.state import PolicySettings, PolicyState

OWNER = Owner()
STATE = OWNER.state()
DERIVE = "cannot derive inference resources for this deployment: "


def plan(document: dict[str, Any], state: PolicySnapshot = STATE, now: Any = NOW) -> dict[str, Any]:
    return state.decide(document, now).body


def only(*profiles: dict[str, Any], keep_cpu: bool = True, **settings: Any) -> PolicySnapshot:
    return OWNER.state(with_profiles(OWNER, *profiles, keep_cpu=keep_cpu), **settings)


def block(**accelerator: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "capability": "gpu",
        "count": 1,
        "memory": {"minimum": "8Gi"},
        "isolation": "any-qualified",
    }
    values.update(accelerator)
    return {"schemaVersion": 1, "accelerator": values, "runtime": {"selection": "automatic"}}


# -- the plan's shape --------------------------------------------------------------------------


def test_contract_example_request_plans_onto_the_mig_slice() -> None:
    body = plan(request())
    assert body == {
        "status": 200,
        "path": "gpu",
        "derived": True,
        "profile": "nvidia-mig-3g40gb",
        "bindingId": "nvidia-mig-3g40gb-amd64",
        "engine": "llamacpp",
        "variantId": "llamacpp-nvidia-amd64",
        "image": catalog_image("llamacpp", "nvidia", "amd64", 13),
        "runtimeClassName": "nvidia",
        "nodeSelector": {"kubernetes.io/arch": "amd64"},
        "resources": {
            "requests": {"nvidia.com/mig-3g.40gb": "1"},
            "limits": {"nvidia.com/mig-3g.40gb": "1"},
        },
        "deviceCount": 1,
        "engineArgs": {},
        "inferenceResources": {
            "schemaVersion": 1,
            "accelerator": {
                "capability": "gpu",
                "count": 1,
                "memory": {"minimum": "7Gi"},
                "isolation": "any-qualified",
                "profile": "nvidia-mig-3g40gb",
            },
            "runtime": {"selection": "automatic"},
        },
        "bundle": {"version": 1, "sha256": OWNER.sign()["data"][DIGEST_KEY]},
    }


def test_decide_is_deterministic() -> None:
    assert plan(request()) == plan(request())


_VARIED = [
    request(),
    request("vllm"),
    request("diffusion"),
    request(config__force_cpu=True),
    request(inferenceResources=block()),
    request(inferenceResources=block(isolation="mig")),
    request(inferenceResources=block(isolation="accounted-share")),
    request(inferenceResources=block(count=2)),
    request(model__weightsBytes=60 * GI),
    request(model__weightsBytes=900 * GI),
]


def test_options_kept_between_decisions_change_no_decision() -> None:
    # A server's state keeps each binding's options per engine between decisions; deciding
    # with them kept, twice over, must give what working them out afresh gives.
    state = OWNER.state()
    for document in _VARIED + _VARIED:
        kept = state.decide(document, NOW)
        fresh = decide(document, state.context(NOW))
        assert kept.body == fresh.body
    # Two deployments that size alike share the plan made for the first; one sized otherwise
    # gets its own.
    first = state.decide(request(model__weightsBytes=4_000_000_000), NOW)
    alike = state.decide(request(model__weightsBytes=4_000_000_001), NOW)
    other = state.decide(request(model__weightsBytes=20 * GI), NOW)
    assert alike is first
    assert other.body != first.body


def test_options_kept_for_one_revision_are_not_used_for_another() -> None:
    old = only(gpu_profile("w", "whole-device", [gpu_binding("w", cc="7.0", cuda=12)]))
    new = only(gpu_profile("w", "whole-device", [gpu_binding("w", cc="9.0", cuda=13)]))
    options = old.options
    assert plan(request(), old)["image"] == catalog_image("llamacpp", "nvidia", "amd64", 12)
    # The same table handed a decision under another revision is rebuilt for it.
    body = decide(request(), new.context(NOW), options).body
    assert body["image"] == catalog_image("llamacpp", "nvidia", "amd64", 13)


# -- tenant mode off ---------------------------------------------------------------------------


def test_disabled_gpu_deployment() -> None:
    state = snapshot_of(PolicySettings(enabled=False), NOW)
    assert plan(request(), state) == {
        "status": 422,
        "detail": "Core cannot see a GPU on this install",
        "code": "tenant-mode-off",
    }
    assert plan(request("vllm"), state)["detail"] == "Core cannot see a GPU on this install"


def test_disabled_cpu_deployment_still_plans() -> None:
    state = snapshot_of(PolicySettings(enabled=False), NOW)
    body = plan(request(config__force_cpu=True), state)
    assert body["status"] == 200
    assert body["path"] == "cpu"
    assert body["bindingId"] is None


# -- engines -----------------------------------------------------------------------------------


def test_mlx_derived() -> None:
    assert plan(request("mlx")) == {
        "status": 422,
        "detail": DERIVE + "engine 'mlx' is not qualified in this release",
        "code": "engine-not-qualified",
    }


def test_mlx_with_block_fails_with_the_same_reason() -> None:
    body = plan(request("mlx", inferenceResources=block()))
    assert body == {
        "status": 422,
        "detail": "engine 'mlx' is not qualified in this release",
        "code": "engine-not-qualified",
    }


def test_card_older_than_every_image() -> None:
    state = only(gpu_profile("old", "whole-device", [gpu_binding("pascal", cc="6.1", cuda=12)]))
    assert plan(request(), state) == {
        "status": 422,
        "detail": DERIVE + "llamacpp requires compute capability 7.0; this binding declares 6.1",
        "code": "no-fit",
    }


def test_card_refusal_with_block_is_nofit() -> None:
    state = only(gpu_profile("old", "whole-device", [gpu_binding("pascal", cc="6.1", cuda=12)]))
    body = plan(request(inferenceResources=block()), state)
    assert body == {
        "status": 422,
        "detail": "llamacpp requires compute capability 7.0; this binding declares 6.1",
        "code": "NoFit",
    }


def test_driver_too_old_for_vllm() -> None:
    state = only(gpu_profile("a100", "whole-device", [gpu_binding("a100", cc="8.0", cuda=12)]))
    assert plan(request("vllm"), state) == {
        "status": 422,
        "detail": DERIVE + "host driver supports CUDA 12 (attested cudaDriverMajor); engine vllm "
        "ships nvidia/amd64 images for CUDA 13+",
        "code": "no-fit",
    }


def test_no_diffusion_image_for_arm64() -> None:
    state = only(gpu_profile("gh200", "whole-device", [gpu_binding("gh", cc="9.0", arch="arm64")]))
    assert plan(request("diffusion"), state)["detail"] == (
        DERIVE + "no diffusion image is published for nvidia/arm64"
    )


def test_vllm_arm64_only_gb10() -> None:
    state = only(gpu_profile("gb200", "whole-device", [gpu_binding("gb", cc="10.0", arch="arm64")]))
    assert plan(request("vllm"), state)["detail"] == (
        DERIVE + "vllm requires compute capability 12.1; this binding declares 10.0"
    )


def test_vllm_requires_bf16_on_amd64() -> None:
    state = only(gpu_profile("t4", "whole-device", [gpu_binding("t4", cc="7.5", cuda=13)]))
    assert plan(request("vllm"), state)["detail"] == (
        DERIVE + "vllm requires compute capability 8.0; this binding declares 7.5"
    )


def test_amd_binding_refused() -> None:
    amd = gpu_binding("mi300", vendor="amd", cuda=None, resource="amd.com/gpu")
    state = only(gpu_profile("amd-whole", "whole-device", [amd]))
    assert plan(request(), state)["detail"] == (
        DERIVE + "no llamacpp image is published for amd/amd64"
    )


@pytest.mark.parametrize(
    ("cc", "cuda", "image_cuda"),
    [("7.5", None, 13), ("7.0", None, 12), ("7.0", 13, 12), ("8.9", 12, 12), ("9.0", 13, 13)],
)
def test_llamacpp_image_choice(cc: str, cuda: int | None, image_cuda: int) -> None:
    state = only(gpu_profile("w", "whole-device", [gpu_binding("w", cc=cc, cuda=cuda)]))
    assert plan(request(), state)["image"] == catalog_image(
        "llamacpp", "nvidia", "amd64", image_cuda
    )


def test_variant_not_listed_by_profile() -> None:
    profile = gpu_profile(
        "w", "whole-device", [gpu_binding("w")], variants=["llamacpp-nvidia-amd64"]
    )
    state = only(profile)
    assert plan(request("vllm"), state)["detail"] == (
        DERIVE + "profile w does not list variant vllm-nvidia-amd64"
    )


def test_variant_listed_without_catalog_image_signs_and_refuses_at_plan() -> None:
    binding = gpu_binding("gh", cc="9.0", arch="arm64")
    profile = gpu_profile(
        "gh",
        "whole-device",
        [binding],
        variants=["llamacpp-nvidia-arm64", "diffusion-nvidia-arm64"],
    )
    state = only(profile)
    assert state.profile is not None
    assert (
        "no diffusion image is published for nvidia/arm64"
        in plan(request("diffusion"), state)["detail"]
    )


# -- external endpoints ------------------------------------------------------------------------


def test_external_with_block() -> None:
    body = plan(request(external=True, inferenceResources=block()))
    assert body == {
        "status": 422,
        "detail": "external endpoints allocate no local resources; omit inferenceResources",
        "code": "external",
    }


@pytest.mark.parametrize("field", ["gpu_allocation", "vram_allocation"])
def test_external_with_allocation(field: str) -> None:
    allocation: dict[str, Any] = {field: 1}
    body = plan(request(external=True, **allocation))
    assert body == {
        "status": 422,
        "detail": "external endpoints allocate no local resources; omit gpu_allocation and "
        "vram_allocation",
        "code": "external",
    }


def test_external_plan_allocates_nothing() -> None:
    body = plan(request(external=True))
    assert body == {"status": 200, "path": "external", "derived": True, "engine": "llamacpp"}


def test_external_not_refused_by_broken_profile() -> None:
    state = OWNER.state(mutate=lambda cm: cm.update(immutable=False))
    assert plan(request(external=True), state)["status"] == 200


def test_cluster_without_tenant_resources_honours_external_overrides() -> None:
    state = snapshot_of(PolicySettings(enabled=False), NOW)
    assert plan(request(external=True, gpu_allocation=1), state)["status"] == 200


# -- diffusion ---------------------------------------------------------------------------------


def test_diffusion_plans_one_device() -> None:
    body = plan(request("diffusion"))
    assert body["status"] == 200
    assert body["image"] == catalog_image("diffusion", "nvidia", "amd64", 12)
    assert body["deviceCount"] == 1


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("lora", {"name": "x"}),
        ("lightning", True),
        ("stream_profile", "realtime"),
        ("trust_remote_code", True),
        ("dfloat11", {"enabled": True}),
        ("tensor_parallel_size", 2),
        ("gpu_count", 2),
    ],
)
def test_diffusion_config_key_named(key: str, value: Any) -> None:
    body = plan(request("diffusion", **{f"config__{key}": value}))
    assert body["status"] == 422
    assert key in body["detail"]


def test_diffusion_dfloat11_by_name_names_no_key() -> None:
    body = plan(request("diffusion", model__name="DFloat11/FLUX.1-dev-DF11"))
    assert body["status"] == 422
    assert "DFloat11 models need more than one device" in body["detail"]
    for key in (
        "lora",
        "lightning",
        "stream_profile",
        "trust_remote_code",
        "dfloat11",
        "tensor_parallel_size",
        "gpu_count",
    ):
        assert key not in body["detail"]


def test_diffusion_stream_profile_from_name_is_kept() -> None:
    assert plan(request("diffusion", model__name="stabilityai/sdxl-turbo-stream"))["status"] == 200


def test_single_file_diffusion_refused() -> None:
    body = plan(request("diffusion", model__format="checkpoint"))
    assert body["status"] == 422
    assert "single-file" in body["detail"]


def test_diffusion_sized_from_weights_without_context() -> None:
    body = plan(request("diffusion"))
    # 6.46 GiB of weights + 512 MiB context + max(1 GiB, weights / 4) = 8.6 GiB -> 9Gi
    assert body["inferenceResources"]["accelerator"]["memory"]["minimum"] == "9Gi"


# -- the profile -------------------------------------------------------------------------------


PROFILE = "owner profile bundle: invalid inference profile authorization: "


def test_profile_missing() -> None:
    state = PolicyFeed(OWNER.settings()).snapshot
    assert plan(request(), state) == {
        "status": 503,
        "detail": PROFILE + "bundle did not arrive from the configured ConfigMap",
        "code": "profile-refused",
    }


def test_profile_wrong_key() -> None:
    other = Owner()
    state = snapshot_of(OWNER.settings(), NOW, profile=other.sign(other.envelope()))
    assert plan(request(), state)["detail"] == (
        PROFILE + "bundle is signed by a key this cluster does not trust"
    )


def test_profile_other_binding() -> None:
    state = OWNER.state(cluster_binding_id="other")
    assert plan(request(), state)["detail"] == (
        PROFILE + "bundle targets another cluster binding, namespace, or a version below the "
        "configured floor"
    )


def test_profile_expired_between_requests() -> None:
    state = OWNER.state()
    assert plan(request(), state)["status"] == 200
    later = NOW + timedelta(days=400)
    assert plan(request(), state, later) == {
        "status": 503,
        "detail": PROFILE + "bundle is expired or its window is empty",
        "code": "profile-refused",
    }


def test_profile_verified_once_per_revision() -> None:
    state = PolicyState(OWNER.settings(), packaged_catalog())
    configmap = OWNER.sign()
    for _ in range(5):
        state.set_profile(configmap, "rev-1", NOW)
    assert state.verifications == 1
    state.set_profile(configmap, "rev-2", NOW)
    assert state.verifications == 2


# -- relocation and image maps -----------------------------------------------------------------


def test_image_map_from_another_release() -> None:
    state = OWNER.state(
        engine_image_map={"ghcr.io/x/old@sha256:" + "1" * 64: "reg/x@sha256:" + "2" * 64}
    )
    assert plan(request(), state) == {
        "status": 503,
        "detail": "engine image map carries no image from this release's catalog",
        "code": "image-map",
    }


def test_image_map_relocates_and_leaves_engines_out() -> None:
    pinned = catalog_image("llamacpp", "nvidia", "amd64", 13)
    target = "registry.local/llamacpp@sha256:" + "3" * 64
    state = OWNER.state(engine_image_map={pinned: target})
    assert plan(request(), state)["image"] == target
    assert plan(request("vllm"), state)["detail"] == (
        DERIVE + "engine 'vllm' is not qualified in this release"
    )


def test_registry_prefix() -> None:
    state = OWNER.state(image_registry_prefix="mirror.local/kz/")
    digest = catalog_image("llamacpp", "nvidia", "amd64", 13).split("@")[1]
    assert plan(request(), state)["image"] == f"mirror.local/kz/images/llamacpp-cuda13@{digest}"


def test_airgap_registry() -> None:
    state = OWNER.state(airgap_registry="https://airgap.local:5000")
    digest = catalog_image("llamacpp", "nvidia", "amd64", 13).split("@")[1]
    assert plan(request(), state)["image"] == (
        f"airgap.local:5000/kamiwaza-internal/containers/images/llamacpp-cuda13@{digest}"
    )


def test_image_map_wins_over_prefix() -> None:
    pinned = catalog_image("llamacpp", "nvidia", "amd64", 13)
    target = "registry.local/llamacpp@sha256:" + "3" * 64
    state = OWNER.state(engine_image_map={pinned: target}, image_registry_prefix="mirror.local")
    assert plan(request(), state)["image"] == target


# -- request rules -----------------------------------------------------------------------------


def test_no_context_anywhere() -> None:
    body = plan(request(config__max_model_len=None, model__contextLength=DELETE))
    assert body["status"] == 422
    assert "no context length is declared" in body["detail"]


def test_context_from_model_when_config_silent() -> None:
    short = plan(request(config__max_model_len=None, model__contextLength=4096))
    assert short["status"] == 200


def test_embedding_needs_pooling() -> None:
    body = plan(request(config__embedding=True, config__pooling=None))
    assert body["status"] == 422
    assert "pooling" in body["detail"]
    assert plan(request(config__embedding=True, config__pooling="mean"))["status"] == 200


def test_vllm_does_not_embed() -> None:
    body = plan(request("vllm", config__embedding=True))
    assert body["status"] == 422
    assert "does not serve embeddings" in body["detail"]


@pytest.mark.parametrize("value", [0, 9, 2.5, "2", True, -1])
def test_device_count_must_be_whole_in_range(value: Any) -> None:
    body = plan(request(config__tensor_parallel_size=value))
    assert body["status"] == 422
    assert (
        "config.tensor_parallel_size must be a whole number of devices from 1 to 8"
        in body["detail"]
    )


def test_block_count_and_config_must_agree() -> None:
    body = plan(request(inferenceResources=block(count=2), config__tensor_parallel_size=1))
    assert body["status"] == 422
    assert "disagree" in body["detail"]


def test_unknown_top_level_key() -> None:
    body = plan(request(priority="high"))
    assert body == {
        "status": 422,
        "detail": "invalid deployment request: priority: unknown field",
        "code": "request-invalid",
    }


def test_unknown_model_key() -> None:
    body = plan(request(model__quant="q4"))
    assert body["detail"] == "invalid deployment request: model.quant: unknown field"


def test_unknown_config_key_ignored() -> None:
    assert plan(request(config__temperature=0.7))["status"] == 200


def test_request_not_an_object() -> None:
    assert plan([])["status"] == 422  # type: ignore[arg-type]


def test_format_must_match_engine() -> None:
    assert "llamacpp serves gguf" in plan(request(model__format="safetensors"))["detail"]


# -- tensor parallelism ------------------------------------------------------------------------


def test_tensor_parallel_on_whole_devices_with_p2p() -> None:
    body = plan(request(config__tensor_parallel_size=2))
    assert body["status"] == 200
    assert body["bindingId"] == "nvidia-whole-amd64"
    assert body["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert body["deviceCount"] == 2


def test_tensor_parallel_refused_on_mig_and_shares() -> None:
    mig = gpu_profile(
        "mig", "mig", [gpu_binding("mig", resource="nvidia.com/mig-3g.40gb", memory="38Gi")]
    )
    state = only(mig)
    body = plan(request(config__tensor_parallel_size=2), state)
    assert body["status"] == 422
    assert "a MIG partition has no peer path" in body["detail"]
    # The refusal names what the tenant changes: the field that asked for two devices.
    assert "(set config.tensor_parallel_size to 1 for it)" in body["detail"]
    block = {
        "schemaVersion": 1,
        "accelerator": {"capability": "gpu", "count": 2, "memory": {"minimum": "8Gi"}},
        "runtime": {"selection": "automatic"},
    }
    body = plan(request(inferenceResources=block, config__tensor_parallel_size=2), state)
    assert body["status"] == 422
    assert "(set inferenceResources.accelerator.count to 1 for it)" in body["detail"]
    share = gpu_profile(
        "share",
        "accounted-share",
        [
            gpu_binding(
                "share",
                allocator="vram-plugin",
                resource="kamiwaza.ai/vram-gb-gpu-0",
                memory="44Gi",
            )
        ],
    )
    body = plan(request(config__tensor_parallel_size=2), only(share))
    assert "an accounted VRAM share is a slice of one device" in body["detail"]
    assert "(set config.tensor_parallel_size to 1 for it)" in body["detail"]


def test_tensor_parallel_needs_p2p() -> None:
    state = only(gpu_profile("w", "whole-device", [gpu_binding("w", features=["bf16", "nvlink"])]))
    body = plan(request(config__tensor_parallel_size=2), state)
    assert "does not attest p2p" in body["detail"]


def test_absent_count_is_one_device_never_the_node() -> None:
    body = plan(request(config__tensor_parallel_size=DELETE))
    assert body["deviceCount"] == 1


# -- binding choice ----------------------------------------------------------------------------


def test_large_model_goes_to_whole_gpu() -> None:
    body = plan(request(model__weightsBytes=60 * GI))
    assert body["bindingId"] == "nvidia-whole-amd64"


def test_medium_model_goes_to_accounted_share() -> None:
    body = plan(request(model__weightsBytes=37 * GI))
    assert body["bindingId"] == "nvidia-vram-l40s-amd64"
    # 37 GiB + 448 MiB of cache + 1.25 GiB of overhead -> a 39 GiB share of the 44Gi card
    assert body["resources"]["limits"] == {"kamiwaza.ai/vram-gb-gpu-0": "39"}


def test_nothing_holds_it() -> None:
    body = plan(request(model__weightsBytes=200 * GI))
    assert body["status"] == 422
    assert body["detail"].startswith(DERIVE + "no binding holds llamacpp at ")
    assert "nvidia-whole-amd64, offers 139Gi" in body["detail"]


def test_block_nofit() -> None:
    body = plan(request(inferenceResources=block(memory={"minimum": "500Gi"})))
    assert body["status"] == 422
    assert body["code"] == "NoFit"


def test_block_names_profile() -> None:
    body = plan(request(inferenceResources=block(profile="nvidia-whole")))
    assert body["bindingId"] == "nvidia-whole-amd64"
    assert body["derived"] is False
    assert body["inferenceResources"]["accelerator"]["memory"]["minimum"] == "8Gi"


def test_block_isolation_filter() -> None:
    body = plan(request(inferenceResources=block(isolation="accounted-share")))
    assert body["bindingId"] == "nvidia-vram-l40s-amd64"


def test_tie_break_prefers_stronger_isolation_then_envelope_order() -> None:
    whole = gpu_profile(
        "whole",
        "whole-device",
        [gpu_binding("whole-a", memory="40Gi"), gpu_binding("whole-b", memory="40Gi")],
    )
    mig = gpu_profile(
        "mig", "mig", [gpu_binding("mig", resource="nvidia.com/mig-7g.80gb", memory="40Gi")]
    )
    assert plan(request(), only(whole, mig))["bindingId"] == "mig"
    assert plan(request(), only(whole))["bindingId"] == "whole-a"


# -- vLLM memory fraction ----------------------------------------------------------------------


def test_vllm_whole_device_default_fraction() -> None:
    body = plan(request("vllm", model__weightsBytes=60 * GI))
    assert body["engineArgs"] == {"gpu_memory_utilization": 0.9}


def test_vllm_accounted_share_fraction() -> None:
    share = gpu_binding(
        "share",
        allocator="vram-plugin",
        resource="kamiwaza.ai/vram-gb-gpu-0",
        memory="44Gi",
        cc="8.9",
        cuda=13,
    )
    state = only(gpu_profile("share", "accounted-share", [share]))
    body = plan(
        request(
            "vllm",
            inferenceResources=block(isolation="accounted-share", memory={"minimum": "18Gi"}),
        ),
        state,
    )
    # share = ceil(18Gi / 0.9) = 20Gi of a 44Gi card; fraction = ceil100(0.9 * 20 / 44) = 0.41
    assert body["resources"]["limits"] == {"kamiwaza.ai/vram-gb-gpu-0": "20"}
    assert body["engineArgs"] == {"gpu_memory_utilization": 0.41}


def test_vllm_gb10_whole_device_fraction() -> None:
    gb10 = gpu_binding("spark", cc="12.1", arch="arm64", memory="121Gi")
    state = only(gpu_profile("spark", "whole-device", [gb10]))
    body = plan(request("vllm", inferenceResources=block(memory={"minimum": "30Gi"})), state)
    assert body["image"] == catalog_image("vllm", "nvidia", "arm64", 13)
    assert body["engineArgs"] == {"gpu_memory_utilization": 0.25}  # ceil100(30 / 121)


# -- CPU path ----------------------------------------------------------------------------------


def test_force_cpu() -> None:
    body = plan(request(config__force_cpu=True))
    assert body["path"] == "cpu"
    assert body["runtimeClassName"] is None
    # 1.25 x 4,683,073,504 bytes = 5.45 GiB -> 6Gi
    assert body["resources"] == {"requests": {"cpu": "100m", "memory": "6Gi"}}
    assert "limits" not in body["resources"]
    assert body["image"] == catalog_image("llamacpp", "cpu", "amd64")
    assert body["deviceCount"] == 0


def test_cpu_floors() -> None:
    small = plan(request(config__force_cpu=True, model__weightsBytes=100 * MI))
    assert small["resources"]["requests"] == {"cpu": "100m", "memory": "1Gi"}
    whisper = plan(request("whispercpp", model__format="checkpoint", model__weightsBytes=148 * MI))
    assert whisper["resources"]["requests"] == {"cpu": "500m", "memory": "2Gi"}
    assert whisper["image"] == catalog_image("whispercpp", "cpu", "amd64")


def test_no_gpu_declared_goes_to_cpu() -> None:
    state = OWNER.state(with_profiles(OWNER))
    assert plan(request(), state)["path"] == "cpu"
    assert plan(request("vllm"), state)["detail"] == (
        DERIVE + "vllm runs on GPU only and the profile declares no GPU binding"
    )


def test_gpu_only_engine_with_force_cpu() -> None:
    body = plan(request("vllm", config__force_cpu=True))
    assert body == {
        "status": 422,
        "detail": "vllm runs on GPU only and config.force_cpu is set",
        "code": "engine-capability",
    }


def test_explicit_cpu_block() -> None:
    cpu: dict[str, Any] = {
        "schemaVersion": 1,
        "cpu": {"architecture": "amd64", "requests": {"cpu": "2", "memory": "8Gi"}},
        "runtime": {"selection": "automatic"},
    }
    body = plan(request(inferenceResources=cpu))
    assert body["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}}
    cpu["cpu"]["architecture"] = "arm64"
    body = plan(request(inferenceResources=cpu))
    assert body["code"] == "NoFit"


# -- recipes -----------------------------------------------------------------------------------


def test_pinned_recipe_runs_its_image_exactly() -> None:
    pinned = catalog_image("llamacpp", "nvidia", "amd64", 13)
    recipes = parse_catalog(
        {
            "schemaVersion": 1,
            "capability": "gpu",
            "recipes": [
                {
                    "id": "qwen-8k",
                    "engine": "llamacpp",
                    "model": "Qwen/Qwen2.5-7B-Instruct-GGUF",
                    "match": {"max_model_len": 8192},
                    "variantId": "llamacpp-nvidia-amd64",
                    "image": pinned,
                }
            ],
        }
    )
    state = replace(OWNER.state(image_registry_prefix="mirror.local"), gpu_recipes=recipes)
    body = plan(request(), state)
    assert body["image"] == pinned
    assert body["recipe"] == "qwen-8k"
    other = plan(request(config__max_model_len=4096), state)
    assert other["image"].startswith("mirror.local/")


def test_pinned_recipe_needs_binding_with_the_same_image() -> None:
    recipes = parse_catalog(
        {
            "schemaVersion": 1,
            "capability": "gpu",
            "recipes": [
                {
                    "id": "qwen",
                    "engine": "llamacpp",
                    "model": "Qwen/Qwen2.5-7B-Instruct-GGUF",
                    "variantId": "llamacpp-nvidia-amd64",
                    "image": "mirror.local/llamacpp@sha256:" + "4" * 64,
                }
            ],
        }
    )
    state = replace(OWNER.state(), gpu_recipes=recipes)
    body = plan(request(), state)
    assert body["status"] == 422
    assert "not the image recipe qwen pins" in body["detail"]


# -- sizing ------------------------------------------------------------------------------------


def test_kv_cache_matches_published_llama31_8b() -> None:
    assert kv_cache_bytes(8192, 32, 8, 128, 0) == 1024 * MI


def test_kv_cache_llama2_7b_no_gqa() -> None:
    assert kv_cache_bytes(2048, 32, 32, 128, 0) == 1024 * MI


def test_fallback_cache_bound_errs_large() -> None:
    exact = kv_cache_bytes(8192, 32, 8, 128, 0)
    bound = kv_cache_bytes(8192, None, None, None, 4_920_739_232)
    assert bound > exact


def test_estimate_splits_across_devices() -> None:
    working = packaged_catalog().engines["vllm"].working_memory
    assert working is not None
    one = estimate_gpu(working, 140 * GI, 16384, 80, 8, 128, 1)
    two = estimate_gpu(working, 140 * GI, 16384, 80, 8, 128, 2)
    assert two.per_device < one.per_device
    assert two.total > one.total


def test_plan_decide_accepts_raw_document() -> None:
    assert decide(request(), STATE.context(NOW)).allowed
