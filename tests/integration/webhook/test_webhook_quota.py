"""The owner's quota in the tenant's webhook: an engine Pod, or a plan, that would take the
namespace past it is refused 403 `quota-exceeded` with the quota, the limit and what is held
named, judged afresh on every review (the answer memo keeps the plan, not the verdict); a quota
it cannot read refuses nothing (the owner's native quota and extender hold the tenant to it)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from inference_policy.placing.quota import QUOTA_ANNOTATION, QUOTA_NAME
from kits.profilekit import NAMESPACE, Owner, request
from kits.webhookkit import apply_patch, engine_pod, patch_of, review, webhook_app
from localcluster.plane.metrics import metric, parse_metrics
from serving.quota import TenantQuota, usage_part
from tests.integration.webhook.test_webhook_admission import admit, denial
from webhook.profile_source import PolicyStore

GPU = "nvidia.com/mig-3g.40gb"


def quota_object(gpus: int | None = 1, **limits: Any) -> dict[str, Any]:
    hard = {} if gpus is None else {f"requests.{GPU}": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": QUOTA_NAME,
            "namespace": NAMESPACE,
            "uid": "q-1",
            "resourceVersion": "7",
            "annotations": {QUOTA_ANNOTATION: json.dumps({"schemaVersion": 1, **limits})},
        },
        "spec": {"hard": hard},
    }


@pytest.fixture
def owner() -> Owner:
    return Owner()


@pytest.fixture
async def served(
    owner: Owner, aiohttp_client: AiohttpClient
) -> tuple[TestClient[Any, Any], PolicyStore]:
    app, _, store = webhook_app(owner)
    store.quota = TenantQuota(NAMESPACE)
    store.quota.quota_changed(quota_object(gpus=1))
    store.quota.pods_listed({})
    return await aiohttp_client(app), store


async def _stored(client: TestClient[Any, Any], name: str) -> dict[str, Any]:
    """An engine Pod admitted and stored as the webhook's patch leaves it."""
    pod = engine_pod(request(), name=name)
    data = await admit(client, review(pod))
    assert data["response"]["allowed"] is True
    stored: dict[str, Any] = apply_patch(pod, patch_of(data))
    return stored


async def test_an_engine_pod_past_the_quota_is_refused_naming_it(
    served: tuple[TestClient[Any, Any], PolicyStore],
) -> None:
    client, store = served
    assert store.quota is not None
    first = await _stored(client, "first")
    store.quota.pod_changed("first", usage_part(first))
    code, reason, message = denial(await admit(client, review(engine_pod(request(), name="two"))))
    assert (code, reason) == (403, "Forbidden")
    assert message == (
        "tenant-mode inference (quota-exceeded): namespace kamiwaza would pass the owner's quota "
        "tmi-quota (nvidia.com/mig-3g.40gb devices: limit 1, held now 1, this Pod asks 1); remove "
        "an engine Pod of the namespace first, or ask the cluster owner to raise the quota"
    )
    text = await (await client.get("/metrics")).text()
    refused = metric(
        parse_metrics(text),
        "tmi_webhook_decisions_total",
        endpoint="mutate",
        outcome="refused",
        status="403",
        reason="quota-exceeded",
    )
    assert refused == 1
    # The first one goes: the same review is admitted again.
    store.quota.pod_changed("first", None)
    assert (await admit(client, review(engine_pod(request(), name="two"))))["response"]["allowed"]


async def test_the_verdict_is_not_remembered_with_the_plan(
    served: tuple[TestClient[Any, Any], PolicyStore],
) -> None:
    """Replicas reach admission as identical reviews but for the uid, and the memo answers all
    but the first; what the namespace holds moves between them."""
    client, store = served
    assert store.quota is not None
    pod = engine_pod(request(), name="")
    pod["metadata"]["generateName"] = "replica-"
    first = await admit(client, review(pod), compact=True)
    assert first["response"]["allowed"] is True
    store.quota.pod_changed("replica-a", usage_part(apply_patch(pod, patch_of(first))))
    code, _, message = denial(await admit(client, review(pod), compact=True))
    assert code == 403 and "held now 1" in message


async def test_the_plan_api_refuses_with_the_code(
    served: tuple[TestClient[Any, Any], PolicyStore],
) -> None:
    client, store = served
    assert store.quota is not None
    assert (await client.post("/v1/plan", json=request())).status == 200
    store.quota.pod_changed("first", usage_part(await _stored(client, "first")))
    resp = await client.post("/v1/plan", json=request())
    body = await resp.json()
    assert resp.status == 403
    assert body["code"] == "quota-exceeded" and body["status"] == 403
    assert "the owner's quota tmi-quota (nvidia.com/mig-3g.40gb devices: limit 1" in body["detail"]
    # A CPU deployment asks no device: only enginePods would hold it back, and none is set.
    assert (await client.post("/v1/plan", json=request(config__force_cpu=True))).status == 200
    store.quota.quota_changed(quota_object(gpus=None, enginePods=1))
    resp = await client.post("/v1/plan", json=request(config__force_cpu=True))
    assert resp.status == 403
    assert "enginePods: limit 1, held now 1, this Pod asks 1" in (await resp.json())["detail"]


async def test_a_quota_the_webhook_cannot_read_refuses_nothing(
    served: tuple[TestClient[Any, Any], PolicyStore],
) -> None:
    client, store = served
    assert store.quota is not None
    store.quota.pod_changed("first", usage_part(await _stored(client, "first")))
    store.quota.quota_changed(None, "may not be read (HTTP 403; check the Role)")
    assert (await admit(client, review(engine_pod(request(), name="b"))))["response"]["allowed"]
    malformed = quota_object()
    malformed["metadata"]["annotations"][QUOTA_ANNOTATION] = "{"
    store.quota.quota_changed(malformed)
    assert store.quota.unreadable is not None
    assert (await admit(client, review(engine_pod(request(), name="c"))))["response"]["allowed"]
    # No quota object at all: no quota.
    store.quota.quota_changed(None)
    assert (await admit(client, review(engine_pod(request(), name="d"))))["response"]["allowed"]


async def test_readyz_waits_for_the_quota_and_the_pods_once_followed(
    owner: Owner, aiohttp_client: AiohttpClient
) -> None:
    app, _, store = webhook_app(owner)
    client = await aiohttp_client(app)
    store.quota = TenantQuota(NAMESPACE)
    resp = await client.get("/readyz")
    assert resp.status == 503 and "quota" in (await resp.json())["detail"]
    store.quota.quota_changed(None, "may not be read (HTTP 403; check the Role)")
    store.quota.pods_listed({})
    assert (await client.get("/readyz")).status == 200
