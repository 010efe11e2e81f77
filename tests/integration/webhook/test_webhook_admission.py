"""POST /mutate through aiohttp's test client: plans, refusals, forgeries and malformed reviews.

Every engine-Pod test applies the returned JSON Patch to the Pod and asserts on the Pod that
would be stored, so the patch is checked for effect, not for wording.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME
from kits.profilekit import EXAMPLES, NAMESPACE, Owner, catalog_image, request
from kits.webhookkit import (
    CPU_SECRET,
    GPU_SECRET,
    PLAN_ANNOTATION,
    REQUEST_ANNOTATION,
    SCHEDULER,
    apply_patch,
    engine_pod,
    patch_of,
    plain_pod,
    published,
    review,
    webhook_app,
)
from localcluster.plane.metrics import metric, parse_metrics

MLX_DETAIL = (
    "cannot derive inference resources for this deployment: engine 'mlx' is not qualified in "
    "this release"
)
PROFILE_PREFIX = "owner profile bundle: invalid inference profile authorization: "


@pytest.fixture
def owner() -> Owner:
    return Owner()


@pytest.fixture
async def client(owner: Owner, aiohttp_client: AiohttpClient) -> TestClient[Any, Any]:
    app, _, _ = webhook_app(owner)
    return await aiohttp_client(app)


async def admit(
    client: TestClient[Any, Any], body: dict[str, Any], compact: bool = False
) -> dict[str, Any]:
    # The API server appends ?timeout=; routing must not depend on the raw URL. `compact`
    # sends the bytes as the API server's encoder writes them (no spaces, kind first).
    if compact:
        resp = await client.post(
            "/mutate?timeout=5s",
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json"},
        )
    else:
        resp = await client.post("/mutate?timeout=5s", json=body)
    assert resp.status == 200, await resp.text()
    data: dict[str, Any] = await resp.json()
    assert data["apiVersion"] == "admission.k8s.io/v1"
    assert data["kind"] == "AdmissionReview"
    assert data["response"]["uid"] == body["request"]["uid"]
    return data


def denial(data: dict[str, Any]) -> tuple[int, str, str]:
    response = data["response"]
    assert response["allowed"] is False
    assert "patch" not in response
    status = response["status"]
    return status["code"], status["reason"], status["message"]


# -- engine Pods are planned ---------------------------------------------------------------------


async def test_gpu_engine_pod_is_rewritten_to_the_plan(
    client: TestClient[Any, Any],
) -> None:
    pod = engine_pod(request(), runtimeClassName="gvisor", nodeSelector={"disk": "ssd"})
    data = await admit(client, review(pod))
    assert data["response"]["allowed"] is True
    planned = apply_patch(pod, patch_of(data))

    plan = json.loads(planned["metadata"]["annotations"][PLAN_ANNOTATION])
    assert plan["status"] == 200 and plan["path"] == "gpu"
    assert plan["bindingId"] == "nvidia-mig-3g40gb-amd64"
    spec = planned["spec"]
    engine = spec["containers"][0]
    assert engine["image"] == plan["image"] == catalog_image("llamacpp", "nvidia", "amd64", 13)
    # The platform's own cpu/memory asks stay; the accelerator comes from the plan.
    assert engine["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/mig-3g.40gb": "1"},
        "limits": {"nvidia.com/mig-3g.40gb": "1"},
    }
    assert engine["args"] == ["--port", "8080"]
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"kubernetes.io/arch": "amd64"}
    assert spec["imagePullSecrets"] == [{"name": GPU_SECRET}]
    assert spec["schedulerName"] == SCHEDULER
    assert spec["readinessGates"] == [{"conditionType": "kamiwaza.ai/AllocationVerified"}]
    # Everything else is untouched, the request annotation included.
    assert planned["metadata"]["annotations"][REQUEST_ANNOTATION] == json.dumps(request())
    assert planned["metadata"]["labels"] == pod["metadata"]["labels"]
    assert data["response"]["auditAnnotations"]["plan-binding"] == "nvidia-mig-3g40gb-amd64"


async def test_plan_annotation_is_the_plan_api_answer(client: TestClient[Any, Any]) -> None:
    pod = engine_pod(request())
    planned = apply_patch(pod, patch_of(await admit(client, review(pod))))
    api = await client.post("/v1/plan", json=request())
    assert api.status == 200
    annotation = planned["metadata"]["annotations"][PLAN_ANNOTATION]
    assert json.loads(annotation) == await api.json()
    assert " " not in annotation  # compact JSON


async def test_cpu_engine_pod_sets_requests_only_and_no_runtime_class(
    client: TestClient[Any, Any],
) -> None:
    pod = engine_pod(
        request(config__force_cpu=True),
        runtimeClassName="nvidia",
        imagePullSecrets=[{"name": "tenant-secret"}],
        containers=[
            {
                "name": "engine",
                "image": "x.invalid/e:1",
                "resources": {
                    "requests": {"cpu": "1", "nvidia.com/gpu": "1"},
                    "limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                },
            }
        ],
    )
    planned = apply_patch(pod, patch_of(await admit(client, review(pod))))
    plan = json.loads(planned["metadata"]["annotations"][PLAN_ANNOTATION])
    assert plan["path"] == "cpu"
    spec = planned["spec"]
    assert "runtimeClassName" not in spec
    assert spec["containers"][0]["resources"] == {"requests": plan["resources"]["requests"]}
    assert spec["containers"][0]["image"] == catalog_image("llamacpp", "cpu", "amd64")
    assert spec["imagePullSecrets"] == [{"name": CPU_SECRET}]
    assert spec["nodeSelector"] == {"kubernetes.io/arch": "amd64"}


async def test_engine_container_annotation_picks_the_container(
    client: TestClient[Any, Any],
) -> None:
    sidecar = {"name": "istio-proxy", "image": "docker.io/istio/proxyv2:1.24.0"}
    engine = {"name": "llama", "image": "placeholder.invalid/engine:1"}
    pod = engine_pod(
        request(),
        containers=[sidecar, engine],
        annotations={"kamiwaza.ai/engine-container": "llama"},
    )
    planned = apply_patch(pod, patch_of(await admit(client, review(pod))))
    # The sidecar holds no grant, so it is only shielded from an image's device variable.
    assert planned["spec"]["containers"][0] == {**sidecar, "env": [VOID]}
    assert planned["spec"]["containers"][1]["image"].startswith("ghcr.io/")
    assert "env" not in planned["spec"]["containers"][1]
    assert "nvidia.com/mig-3g.40gb" in planned["spec"]["containers"][1]["resources"]["limits"]


async def test_a_planned_pod_needs_no_further_patch(client: TestClient[Any, Any]) -> None:
    pod = engine_pod(request(), readinessGates=[{"conditionType": "other/Gate"}])
    planned = apply_patch(pod, patch_of(await admit(client, review(pod))))
    assert planned["spec"]["readinessGates"] == [
        {"conditionType": "other/Gate"},
        {"conditionType": "kamiwaza.ai/AllocationVerified"},
    ]
    again = await admit(client, review(planned))
    assert again["response"]["allowed"] is True
    assert patch_of(again) == []


async def test_pods_outside_the_served_namespace_are_untouched(
    client: TestClient[Any, Any],
) -> None:
    for pod in (
        engine_pod(request()),
        engine_pod({"engine": "mlx"}),
        plain_pod(runtimeClassName="nvidia"),
    ):
        data = await admit(client, review(pod, namespace="elsewhere"))
        assert data["response"]["allowed"] is True
        assert "patch" not in data["response"]


async def test_plain_pod_is_allowed_and_only_shielded(client: TestClient[Any, Any]) -> None:
    pod = plain_pod()
    data = await admit(client, review(pod))
    assert data["response"]["allowed"] is True
    shielded = apply_patch(pod, patch_of(data))
    assert shielded["spec"]["containers"] == [{**pod["spec"]["containers"][0], "env": [VOID]}]
    assert {k: v for k, v in shielded.items() if k != "spec"} == {
        k: v for k, v in pod.items() if k != "spec"
    }
    # A Pod that shields itself needs nothing.
    again = await admit(client, review(shielded))
    assert again["response"] == {"uid": again["response"]["uid"], "allowed": True}


async def test_every_container_without_a_grant_is_shielded(client: TestClient[Any, Any]) -> None:
    # The image's own NVIDIA_VISIBLE_DEVICES=all (every CUDA base image sets it) cannot be seen
    # here; an explicit env entry wins over the image and over envFrom, so each container that
    # holds no grant gets one, after its own variables.
    init = {"name": "fetch", "image": "nvidia/cuda:12.8.0-base-ubuntu24.04", "env": [ENV_A]}
    tool = {
        "name": "tool",
        "image": "x",
        "envFrom": [{"prefix": "APP_", "configMapRef": {"name": "settings"}}],
    }
    pod = engine_pod(request(), containers=[ENGINE, tool], initContainers=[init])
    planned = apply_patch(pod, patch_of(await admit(client, review(pod))))
    engine, sidecar = planned["spec"]["containers"]
    assert "env" not in engine  # the device plugin's grant reaches it
    assert sidecar["env"] == [VOID] and sidecar["envFrom"] == tool["envFrom"]
    assert planned["spec"]["initContainers"][0]["env"] == [ENV_A, VOID]
    cpu = engine_pod(request(config__force_cpu=True), containers=[ENGINE])
    planned = apply_patch(cpu, patch_of(await admit(client, review(cpu))))
    assert planned["spec"]["containers"][0]["env"] == [VOID]  # a CPU plan grants no device


async def test_a_sidecar_may_not_take_device_variables_from_env_from(
    client: TestClient[Any, Any],
) -> None:
    # The shield's explicit NVIDIA value wins over envFrom, but another vendor's runtime reads
    # its own namespace (HABANA_VISIBLE_DEVICES from a ConfigMap), so a source that could set
    # any device variable is refused on every container, with what to change.
    tool = {"name": "tool", "image": "x", "envFrom": [{"configMapRef": {"name": "gpus"}}]}
    pod = engine_pod(request(), containers=[ENGINE, tool])
    response = (await admit(client, review(pod)))["response"]
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert "spec.containers[tool].envFrom" in response["status"]["message"]


async def test_an_added_ephemeral_container_is_shielded(client: TestClient[Any, Any]) -> None:
    old = plain_pod()
    old["spec"]["containers"][0]["env"] = [VOID]
    old["spec"]["ephemeralContainers"] = [{"name": "debug-1", "image": "busybox"}]
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"].append({"name": "debug-2", "image": "busybox"})
    data = await admit(client, review(new, operation="UPDATE", old=old))
    patched = apply_patch(new, patch_of(data))
    # The one the update adds; the earlier one is immutable now and left as it is.
    assert patched["spec"]["ephemeralContainers"] == [
        {"name": "debug-1", "image": "busybox"},
        {"name": "debug-2", "image": "busybox", "env": [VOID]},
    ]


VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
ENV_A = {"name": "A", "value": "1"}
ENGINE = {"name": "engine", "image": "placeholder.invalid/engine:1"}


# -- refusals carry the plan's status and the seed's words ----------------------------------------


async def test_mlx_is_refused_422_with_the_seed_detail(client: TestClient[Any, Any]) -> None:
    mlx = json.loads((EXAMPLES / "request-mlx.json").read_text())
    code, reason, message = denial(await admit(client, review(engine_pod(mlx))))
    assert (code, reason, message) == (422, "Invalid", MLX_DETAIL)


async def test_missing_profile_configmap_is_refused_503(
    owner: Owner, aiohttp_client: AiohttpClient
) -> None:
    app, _, _ = webhook_app(owner, configmaps={})
    client = await aiohttp_client(app)
    code, reason, message = denial(await admit(client, review(engine_pod(request()))))
    assert (code, reason) == (503, "ServiceUnavailable")
    assert message == PROFILE_PREFIX + "bundle did not arrive from the configured ConfigMap"
    assert (await client.get("/readyz")).status == 200  # a refused profile is not unreadiness


async def test_profile_signed_by_an_untrusted_key_is_refused_503(
    owner: Owner, aiohttp_client: AiohttpClient
) -> None:
    stranger = Owner()
    configmaps = {DEFAULT_CONFIGMAP_NAME: published(stranger.sign(stranger.envelope()))}
    app, _, _ = webhook_app(owner, configmaps=configmaps)
    client = await aiohttp_client(app)
    code, _, message = denial(await admit(client, review(engine_pod(request()))))
    assert code == 503
    assert message == PROFILE_PREFIX + "bundle is signed by a key this cluster does not trust"


async def test_mutable_profile_configmap_did_not_arrive(
    owner: Owner, aiohttp_client: AiohttpClient
) -> None:
    configmap = published(owner.sign())
    configmap["immutable"] = False
    app, _, _ = webhook_app(owner, configmaps={DEFAULT_CONFIGMAP_NAME: configmap})
    client = await aiohttp_client(app)
    code, _, message = denial(await admit(client, review(engine_pod(request()))))
    assert code == 503
    assert message == PROFILE_PREFIX + "bundle did not arrive from the configured ConfigMap"


async def test_profile_revisions_are_followed(owner: Owner, aiohttp_client: AiohttpClient) -> None:
    app, source, _ = webhook_app(owner, configmaps={})
    client = await aiohttp_client(app)
    code, _, _ = denial(await admit(client, review(engine_pod(request()))))
    assert code == 503
    source.put(DEFAULT_CONFIGMAP_NAME, published(owner.sign(), resource_version="7"))
    data = await admit(client, review(engine_pod(request())))
    assert data["response"]["allowed"] is True
    source.put(DEFAULT_CONFIGMAP_NAME, None)
    code, _, message = denial(await admit(client, review(engine_pod(request()))))
    assert (code, message) == (
        503,
        PROFILE_PREFIX + "bundle did not arrive from the configured ConfigMap",
    )


async def test_profile_is_verified_once_per_revision(
    owner: Owner, aiohttp_client: AiohttpClient
) -> None:
    configmap = published(owner.sign(), uid="u-1", resource_version="41")
    app, source, store = webhook_app(owner, configmaps={DEFAULT_CONFIGMAP_NAME: configmap})
    client = await aiohttp_client(app)
    for _ in range(25):
        data = await admit(client, review(engine_pod(request())))
        assert data["response"]["allowed"] is True
        # A resync or a reconnect re-delivers the same revision.
        source.put(DEFAULT_CONFIGMAP_NAME, copy.deepcopy(configmap))
    assert store.state.verifications == 1
    source.put(DEFAULT_CONFIGMAP_NAME, published(owner.sign(), uid="u-2", resource_version="42"))
    assert store.state.verifications == 2


async def test_missing_recipe_catalog_refuses_local_deployments(
    owner: Owner, aiohttp_client: AiohttpClient
) -> None:
    app, _, _ = webhook_app(owner, gpu_recipe_catalog_configmap="kamiwaza-inference-gpu-x")
    client = await aiohttp_client(app)
    code, _, message = denial(await admit(client, review(engine_pod(request()))))
    assert code == 503
    assert message.startswith("recipe catalog: gpu recipe catalog did not arrive from the ")
    assert "'kamiwaza-inference-gpu-x' was not found in namespace 'kamiwaza'" in message


async def test_engine_pod_without_request_annotation_is_refused_422(
    client: TestClient[Any, Any],
) -> None:
    code, _, message = denial(await admit(client, review(engine_pod(None))))
    assert code == 422
    assert "no kamiwaza.ai/deployment-request annotation" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{not json", "not JSON"),
        ('{"engine": "llamacpp", "engine": "vllm"}', "duplicate key 'engine'"),
        ('{"schemaVersion": 1, "engine": "llamacpp", "bogus": 1}', "bogus: unknown field"),
        ("[]", "must be a JSON object"),
    ],
)
async def test_invalid_request_annotation_is_refused_422(
    client: TestClient[Any, Any], text: str, expected: str
) -> None:
    code, reason, message = denial(await admit(client, review(engine_pod(text))))
    assert (code, reason) == (422, "Invalid")
    assert expected in message


async def test_engine_container_annotation_must_name_a_container(
    client: TestClient[Any, Any],
) -> None:
    pod = engine_pod(request(), annotations={"kamiwaza.ai/engine-container": "nope"})
    code, _, message = denial(await admit(client, review(pod)))
    assert code == 422 and "'nope'" in message


async def test_external_request_creates_no_engine_pod(client: TestClient[Any, Any]) -> None:
    external = {"schemaVersion": 1, "engine": "openai", "external": True}
    code, _, message = denial(await admit(client, review(engine_pod(external))))
    assert code == 422 and "external" in message


# -- forgeries ----------------------------------------------------------------------------------


def _with_container(kind: str, container: dict[str, Any]) -> dict[str, Any]:
    pod = plain_pod()
    pod["spec"].setdefault(kind, []).append(container)
    return pod


FORGERIES: list[tuple[str, dict[str, Any], str]] = [
    (
        "container limit",
        _with_container(
            "containers", {"name": "miner", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        ),
        "spec.containers[miner].resources.limits[nvidia.com/gpu]",
    ),
    (
        "init container request",
        _with_container(
            "initContainers", {"name": "warm", "resources": {"requests": {"amd.com/gpu": "1"}}}
        ),
        "spec.initContainers[warm].resources.requests[amd.com/gpu]",
    ),
    (
        "ephemeral container vram share",
        _with_container(
            "ephemeralContainers",
            {"name": "dbg", "resources": {"limits": {"kamiwaza.ai/vram-gb-gpu-0": "8"}}},
        ),
        "spec.ephemeralContainers[dbg].resources.limits[kamiwaza.ai/vram-gb-gpu-0]",
    ),
    (
        "mig slice",
        _with_container(
            "containers",
            {"name": "m", "resources": {"requests": {"nvidia.com/mig-3g.40gb": "1"}}},
        ),
        "spec.containers[m].resources.requests[nvidia.com/mig-3g.40gb]",
    ),
    ("runtime class", plain_pod(runtimeClassName="nvidia"), "spec.runtimeClassName (nvidia)"),
    (
        "device environment",
        _with_container(
            "containers",
            {"name": "env", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]},
        ),
        "spec.containers[env].env[NVIDIA_VISIBLE_DEVICES]",
    ),
    (
        "resource claim",
        plain_pod(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "gpu"}]),
        "spec.resourceClaims",
    ),
]


def _plan_annotated() -> dict[str, Any]:
    pod = plain_pod()
    pod["metadata"]["annotations"][PLAN_ANNOTATION] = json.dumps({"status": 200, "path": "gpu"})
    return pod


FORGERIES.append(("plan annotation", _plan_annotated(), "metadata.annotations[kamiwaza.ai/plan]"))


@pytest.mark.parametrize(("case", "pod", "field"), FORGERIES, ids=[f[0] for f in FORGERIES])
async def test_forgery_is_refused_403(
    client: TestClient[Any, Any], case: str, pod: dict[str, Any], field: str
) -> None:
    code, reason, message = denial(await admit(client, review(pod)))
    assert (code, reason) == (403, "Forbidden")
    assert field in message
    assert message.startswith("tenant-mode inference: this Pod asks for accelerator access")


# An engine Pod's RuntimeClass, resource claims and plan annotation are the plan's to set, not
# forgeries (a claim its sidecar references is one: _with_container's cases).
SIDECAR_FORGERIES = [
    f for f in FORGERIES if f[0] not in ("runtime class", "plan annotation", "resource claim")
]


@pytest.mark.parametrize(
    ("case", "pod", "field"), SIDECAR_FORGERIES, ids=[f[0] for f in SIDECAR_FORGERIES]
)
async def test_forgery_on_an_engine_pod_sidecar_is_refused(
    client: TestClient[Any, Any], case: str, pod: dict[str, Any], field: str
) -> None:
    forged = engine_pod(request())
    forged["spec"]["containers"] += [c for c in pod["spec"].get("containers", [])[1:]]
    for key in ("initContainers", "ephemeralContainers", "resourceClaims"):
        if key in pod["spec"]:
            forged["spec"][key] = pod["spec"][key]
    code, _, message = denial(await admit(client, review(forged)))
    assert code == 403 and field in message


async def test_engine_pod_with_node_name_is_refused(client: TestClient[Any, Any]) -> None:
    code, _, message = denial(await admit(client, review(engine_pod(request(), nodeName="n1"))))
    assert code == 403 and "spec.nodeName" in message


async def test_engine_container_own_gpu_ask_is_replaced_not_refused(
    client: TestClient[Any, Any],
) -> None:
    pod = engine_pod(
        request(),
        containers=[
            {"name": "engine", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}}
        ],
    )
    planned = apply_patch(pod, patch_of(await admit(client, review(pod))))
    assert planned["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/mig-3g.40gb": "1"
    }


async def test_engine_pods_own_claims_are_replaced_by_the_plans(
    client: TestClient[Any, Any],
) -> None:
    pod = engine_pod(
        request(),
        containers=[{"name": "engine", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
    )
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "tenant-claim"}]
    planned = apply_patch(pod, patch_of(await admit(client, review(pod))))
    # A device-plugin plan holds no claim: the tenant's goes, with the container's reference.
    assert "resourceClaims" not in planned["spec"]
    assert "claims" not in planned["spec"]["containers"][0]["resources"]


# -- UPDATE ------------------------------------------------------------------------------------


async def _admitted(client: TestClient[Any, Any]) -> dict[str, Any]:
    pod = engine_pod(request())
    return apply_patch(pod, patch_of(await admit(client, review(pod))))  # type: ignore[no-any-return]


async def test_plan_annotation_cannot_change_on_update(client: TestClient[Any, Any]) -> None:
    old = await _admitted(client)
    changed = copy.deepcopy(old)
    plan = json.loads(changed["metadata"]["annotations"][PLAN_ANNOTATION])
    plan["resources"]["limits"] = {"nvidia.com/gpu": "8"}
    changed["metadata"]["annotations"][PLAN_ANNOTATION] = json.dumps(plan)
    code, _, message = denial(await admit(client, review(changed, operation="UPDATE", old=old)))
    assert code == 403 and "cannot be changed or removed" in message

    removed = copy.deepcopy(old)
    del removed["metadata"]["annotations"][PLAN_ANNOTATION]
    code, _, message = denial(await admit(client, review(removed, operation="UPDATE", old=old)))
    assert code == 403 and "cannot be changed or removed" in message


async def test_plan_annotation_cannot_be_added_on_update(client: TestClient[Any, Any]) -> None:
    old = plain_pod()
    new = _plan_annotated()
    code, _, message = denial(await admit(client, review(new, operation="UPDATE", old=old)))
    assert code == 403 and "cannot be added afterwards" in message


async def test_metadata_update_of_a_planned_pod_is_allowed(client: TestClient[Any, Any]) -> None:
    old = await _admitted(client)
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["extra"] = "yes"
    data = await admit(client, review(new, operation="UPDATE", old=old))
    assert data["response"]["allowed"] is True and "patch" not in data["response"]


async def test_planned_image_cannot_be_swapped(client: TestClient[Any, Any]) -> None:
    old = await _admitted(client)
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["image"] = "evil.invalid/miner:latest"
    code, _, message = denial(await admit(client, review(new, operation="UPDATE", old=old)))
    assert code == 403 and "runs the image its plan names" in message


async def test_ephemeral_container_with_devices_is_refused_on_update(
    client: TestClient[Any, Any],
) -> None:
    old = await _admitted(client)
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [
        {"name": "dbg", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    ]
    code, _, message = denial(await admit(client, review(new, operation="UPDATE", old=old)))
    assert code == 403 and "ephemeralContainers[dbg].env[NVIDIA_VISIBLE_DEVICES]" in message


# -- malformed input never becomes a 500 ---------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"not json", "not JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}', "expected"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "no request"),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}',
            "no uid",
        ),
        (b'{"a": 1, "a": 2}', "expected apiVersion"),
        (b'{"x": NaN}', "not JSON"),
        (b"\xef\xbb\xbf{}", "byte order mark"),
        (b"[" * 2000 + b"]" * 2000, "depth limit"),
    ],
)
async def test_malformed_review_is_400(
    client: TestClient[Any, Any], body: bytes, expected: str
) -> None:
    resp = await client.post("/mutate", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == 400
    problem = await resp.json()
    assert problem["status"] == 400 and expected in problem["detail"]


@pytest.mark.parametrize(
    "obj",
    [
        None,
        "a string",
        {"kind": "Pod", "metadata": {}, "spec": {"containers": []}},
        {"kind": "Pod", "metadata": {"labels": {"a": 1}}, "spec": {"containers": [{"name": "c"}]}},
        {"kind": "Pod", "metadata": {}, "spec": {"containers": [{"name": "c", "env": "x"}]}},
        {"kind": "Deployment", "spec": {}},
    ],
)
async def test_unreadable_pod_is_denied_400(client: TestClient[Any, Any], obj: Any) -> None:
    code, reason, message = denial(await admit(client, review(obj)))
    assert (code, reason) == (400, "BadRequest")
    assert message.startswith("the Pod in this review cannot be read")


async def test_other_resources_are_denied_400(client: TestClient[Any, Any]) -> None:
    body = review(plain_pod())
    body["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    code, _, message = denial(await admit(client, body))
    assert code == 400 and "reviews core/v1 Pods" in message


async def test_delete_is_allowed_without_patch(client: TestClient[Any, Any]) -> None:
    data = await admit(client, review(None, operation="DELETE", old=plain_pod()))
    assert data["response"] == {"uid": data["response"]["uid"], "allowed": True}


async def test_oversize_body_is_rejected_413(owner: Owner, aiohttp_client: AiohttpClient) -> None:
    app, _, _ = webhook_app(owner, max_body_bytes=64 * 1024)
    client = await aiohttp_client(app)
    pod = engine_pod(request(), annotations={"filler": "x" * 70_000})
    resp = await client.post("/mutate", json=review(pod))
    assert resp.status == 413
    problem = await resp.json()
    assert problem == {
        "status": 413,
        "detail": "request body is larger than the limit of 65536 bytes",
    }
    resp = await client.post("/v1/plan", data=b"{" + b" " * 70_000 + b"}")
    assert resp.status == 413


# -- health, readiness and metrics -------------------------------------------------------------


class _Silent:
    """A source that never delivers: the API server has not answered yet."""

    async def start(self, store: Any) -> None:
        return None

    async def stop(self) -> None:
        return None


async def test_readyz_waits_for_the_first_read(owner: Owner, aiohttp_client: AiohttpClient) -> None:
    from webhook.app import create_app

    app = create_app(owner.settings(), _Silent())
    client = await aiohttp_client(app)
    assert (await client.get("/healthz")).status == 200
    resp = await client.get("/readyz")
    assert resp.status == 503
    assert "kamiwaza-inference-profiles" in (await resp.json())["detail"]
    code, _, _ = denial(await admit(client, review(engine_pod(request()))))
    assert code == 503


async def test_tenant_mode_off_needs_no_configmap(
    owner: Owner, aiohttp_client: AiohttpClient
) -> None:
    app, _, store = webhook_app(owner, enabled=False)
    client = await aiohttp_client(app)
    assert store.names == []
    assert (await client.get("/readyz")).status == 200
    code, _, message = denial(await admit(client, review(engine_pod(request()))))
    assert (code, message) == (422, "Core cannot see a GPU on this install")


async def test_metrics_expose_decisions_latency_and_profile(
    client: TestClient[Any, Any],
) -> None:
    await admit(client, review(engine_pod(request())))
    await admit(client, review(engine_pod(request(engine="mlx"))))
    await admit(client, review(plain_pod(runtimeClassName="nvidia")))
    await client.post("/mutate", data=b"nope")
    text = await (await client.get("/metrics")).text()
    for line in (
        'tmi_webhook_decisions_total{endpoint="mutate",outcome="patched",reason="planned",'
        'status="200"} 1.0',
        'tmi_webhook_decisions_total{endpoint="mutate",outcome="refused",'
        'reason="engine-not-qualified",status="422"} 1.0',
        'tmi_webhook_decisions_total{endpoint="mutate",outcome="refused",reason="forgery",'
        'status="403"} 1.0',
        'tmi_webhook_decisions_total{endpoint="mutate",outcome="error",'
        'reason="malformed-review",status="400"} 1.0',
        'tmi_webhook_request_duration_seconds_count{endpoint="mutate"} 3.0',
        "tmi_webhook_profile_version 1.0",
        "tmi_webhook_profile_valid 1.0",
        "tmi_webhook_profile_verifications_total 1.0",
        "tmi_webhook_inputs_ready 1.0",
    ):
        assert line in text, line
    assert metric(parse_metrics(text), "tmi_webhook_profile_expiry_seconds") > 0


async def test_two_apps_in_one_process_keep_their_own_metrics(
    owner: Owner, aiohttp_client: AiohttpClient
) -> None:
    first = await aiohttp_client(webhook_app(owner)[0])
    second = await aiohttp_client(webhook_app(owner)[0])
    await admit(first, review(plain_pod()))
    text = await (await second.get("/metrics")).text()
    assert 'outcome="allowed"' not in text
    assert NAMESPACE  # the served namespace is the profile's


# -- memoised answers ----------------------------------------------------------------------------


@pytest.mark.parametrize("compact", [True, False], ids=["api-server-bytes", "other-bytes"])
async def test_replica_reviews_are_answered_once_each_with_its_own_uid(
    owner: Owner, aiohttp_client: AiohttpClient, compact: bool
) -> None:
    from webhook.app import RUNTIME

    app, _, _ = webhook_app(owner)
    client = await aiohttp_client(app)
    pod = engine_pod(request(), name="")
    pod["metadata"]["generateName"] = "tmi-3f2a9c-"
    answers = [await admit(client, review(pod), compact) for _ in range(5)]
    assert len({a["response"]["uid"] for a in answers}) == 5  # admit() checks each echo
    assert len({a["response"]["patch"] for a in answers}) == 1
    # Only the API server's own bytes are keyed by their text; any other body is answered
    # afresh, and its request text still plans once.
    hits = 4 if compact else 0
    assert app[RUNTIME].reviewer.answers.hits == hits
    assert app[RUNTIME].store.plans.hits == 4 - hits
    text = await (await client.get("/metrics")).text()
    assert f'tmi_webhook_memo_hits_total{{memo="answers"}} {hits}.0' in text


async def test_a_deeply_nested_review_is_answered_not_an_internal_error(
    client: TestClient[Any, Any],
) -> None:
    # orjson decodes up to 1,024 levels but encodes only 254; a review re-encoded to make a memo
    # key used to fail there and be denied as an internal error. Keys out of the API server's
    # order and a value nested 300 deep: answered on its merits (a plain Pod is allowed).
    nested: Any = "leaf"
    for _ in range(300):
        nested = {"x": nested}
    pod = plain_pod()
    pod["spec"]["affinity"] = nested
    body = review(pod)
    body = {"apiVersion": body["apiVersion"], "request": body["request"], "kind": body["kind"]}
    data = await admit(client, body)
    assert data["response"]["allowed"] is True
    assert "status" not in data["response"]


async def test_memoised_plans_respect_the_profile_window(
    owner: Owner, aiohttp_client: AiohttpClient
) -> None:
    from datetime import timedelta

    from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME as NAME
    from kits.memory_sources import WebhookMemorySource as MemorySource
    from kits.profilekit import NOW
    from webhook.app import create_app
    from webhook.profile_source import PolicyStore

    clock = [NOW]
    settings = owner.settings()
    store = PolicyStore(settings, clock=lambda: clock[0])
    app = create_app(
        settings,
        MemorySource({NAME: published(owner.sign())}),
        store=store,
        clock=lambda: clock[0],
    )
    client = await aiohttp_client(app)
    pod = engine_pod(request())
    assert (await admit(client, review(pod)))["response"]["allowed"] is True
    assert (await client.post("/v1/plan", json=request())).status == 200
    clock[0] = NOW + timedelta(days=400)  # past expiresAt 2027-11-01
    code, _, message = denial(await admit(client, review(pod)))
    assert (code, message) == (503, PROFILE_PREFIX + "bundle is expired or its window is empty")
    resp = await client.post("/v1/plan", json=request())
    assert resp.status == 503
    clock[0] = NOW
    assert (await admit(client, review(pod)))["response"]["allowed"] is True


async def test_memoised_plans_follow_a_new_revision(
    owner: Owner, aiohttp_client: AiohttpClient
) -> None:
    app, source, _ = webhook_app(owner)
    client = await aiohttp_client(app)
    pod = engine_pod(request())
    first = apply_patch(pod, patch_of(await admit(client, review(pod))))
    source.put(
        DEFAULT_CONFIGMAP_NAME,
        published(owner.sign(owner.envelope(version=2)), resource_version="2002"),
    )
    second = apply_patch(pod, patch_of(await admit(client, review(pod))))
    plans = [json.loads(p["metadata"]["annotations"][PLAN_ANNOTATION]) for p in (first, second)]
    assert [p["bundle"]["version"] for p in plans] == [1, 2]


@pytest.mark.parametrize("compact", [True, False], ids=["api-server-bytes", "other-bytes"])
async def test_a_posted_review_cannot_lend_its_answer_to_another_pod(
    client: TestClient[Any, Any], compact: bool
) -> None:
    # Cutting the uid's text out of a body would make these two reviews one key: the first
    # (posted by anyone, uid "hugepages-") asks for "hugepages-nvidia.com/gpu", which is a
    # standard resource's name and harmless, and the second, from the API server, asks for
    # nvidia.com/gpu.
    def forged(key: str) -> dict[str, Any]:
        pod = plain_pod()
        pod["spec"]["containers"][0]["resources"] = {"limits": {key: "1"}}
        return pod

    harmless = await admit(
        client, review(forged("hugepages-nvidia.com/gpu"), uid="hugepages-"), compact
    )
    assert harmless["response"]["allowed"] is True
    code, _, message = denial(await admit(client, review(forged("nvidia.com/gpu")), compact))
    assert code == 403 and "nvidia.com/gpu" in message
