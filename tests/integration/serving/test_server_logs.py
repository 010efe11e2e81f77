"""What each server logs about its decisions, read as the JSON lines `serving.logs` writes.

We test these aspects: the webhook writes one line per answered review (a refusal at INFO with
uid, namespace, Pod, operation, outcome, status and code; an admitted Pod only at DEBUG, with
its binding; a bug at ERROR with the traceback, and the Pod still refused); `/v1/plan` answers
a bug with its JSON problem rather than aiohttp's bare 500; the extender writes a summary per
filter and prioritize call at INFO and a line per refused node at DEBUG, with the placement
codes; the controller writes a line per condition patch with the verdict, code and binding.
Every record is passed through the real formatter, so the assertions are on the line itself.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pytest_aiohttp import AiohttpClient

from allocation_controller.reconciler import Reconciler, ReconcileSettings
from allocation_controller.revisions import PolicyView
from kits import extenderkit
from kits.controllerkit import MemoryKube
from kits.fleetkit import FLEET
from kits.podstates import bind, planned_pod
from kits.profilekit import NAMESPACE, NOW, Owner, request
from kits.webhookkit import engine_pod, plain_pod, review, webhook_app
from serving.logs import JsonFormatter
from tests.integration.extender.test_extender import ALL
from webhook.app import RUNTIME


def lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[dict[str, Any]]:
    """The captured records of one logger as the JSON objects the servers write."""
    formatter = JsonFormatter()
    out = []
    for record in caplog.records:
        if record.name == logger:
            text = formatter.format(record)
            assert "\n" not in text
            out.append(orjson.loads(text))
    return out


@pytest.fixture
def owner() -> Owner:
    return Owner()


# -- the webhook ---------------------------------------------------------------------------------


async def test_webhook_refusal_is_one_info_line_with_the_review_fields(
    owner: Owner, aiohttp_client: AiohttpClient, caplog: pytest.LogCaptureFixture
) -> None:
    client = await aiohttp_client(webhook_app(owner)[0])
    body = review(plain_pod(runtimeClassName="nvidia"), uid="0f5b-forged")
    with caplog.at_level("INFO", "webhook.app"):
        resp = await client.post("/mutate", json=body)
        assert resp.status == 200
        # An admitted Pod writes nothing at INFO: the admission path stays quiet and cheap.
        await client.post("/mutate", json=review(engine_pod(request())))
    [line] = lines(caplog, "webhook.app")
    assert line["level"] == "INFO" and line["msg"] == "review answered"
    assert {
        k: line[k] for k in ("uid", "namespace", "pod", "operation", "outcome", "status", "code")
    } == {
        "uid": "0f5b-forged",
        "namespace": NAMESPACE,
        "pod": "tenant-app",
        "operation": "CREATE",
        "outcome": "refused",
        "status": 403,
        "code": "forgery",
    }
    assert line["detail"].startswith("tenant-mode inference: this Pod asks for accelerator access")
    assert "binding" not in line


async def test_webhook_admitted_pod_is_logged_at_debug_with_its_binding(
    owner: Owner, aiohttp_client: AiohttpClient, caplog: pytest.LogCaptureFixture
) -> None:
    client = await aiohttp_client(webhook_app(owner)[0])
    pod = engine_pod(request())
    del pod["metadata"]["name"]
    pod["metadata"]["generateName"] = "tmi-3f2a9c-"
    with caplog.at_level("DEBUG", "webhook.app"):
        resp = await client.post("/mutate", json=review(pod, uid="u-planned"))
    assert resp.status == 200
    [line] = lines(caplog, "webhook.app")
    assert line["level"] == "DEBUG"
    assert (line["uid"], line["pod"], line["outcome"], line["status"], line["code"]) == (
        "u-planned",
        "tmi-3f2a9c-",
        "patched",
        200,
        "planned",
    )
    expected = owner.state().decide(request(), NOW).body["bindingId"]
    assert line["binding"] == expected


async def test_webhook_bug_refuses_the_pod_and_logs_the_traceback(
    owner: Owner,
    aiohttp_client: AiohttpClient,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = webhook_app(owner)[0]
    client = await aiohttp_client(app)

    class Broken:
        # A stand-in for the reviewer rather than a patched method: the bug is the reviewer's
        # whole answer, whatever path inside it a change would take.
        def answer(self, *_: Any) -> Any:
            raise RuntimeError("a bug")

    monkeypatch.setattr(app[RUNTIME], "reviewer", Broken())
    with caplog.at_level("INFO", "webhook.app"):
        resp = await client.post("/mutate", json=review(engine_pod(request()), uid="u-bug"))
    answer = (await resp.json())["response"]
    assert resp.status == 200 and answer["allowed"] is False
    assert answer["status"]["code"] == 500
    [line] = lines(caplog, "webhook.app")
    assert (line["level"], line["uid"], line["pod"], line["status"]) == (
        "ERROR",
        "u-bug",
        "tmi-3f2a9c",
        500,
    )
    assert line["exc"].endswith("RuntimeError: a bug")


async def test_webhook_malformed_review_is_a_warning(
    owner: Owner, aiohttp_client: AiohttpClient, caplog: pytest.LogCaptureFixture
) -> None:
    client = await aiohttp_client(webhook_app(owner)[0])
    with caplog.at_level("INFO", "webhook.app"):
        resp = await client.post("/mutate", data=b"[]")
    assert resp.status == 400
    [line] = lines(caplog, "webhook.app")
    assert (line["level"], line["status"], line["code"]) == ("WARNING", 400, "malformed-review")
    assert "AdmissionReview" in line["detail"]


async def test_plan_api_bug_is_a_json_problem_not_a_bare_500(
    owner: Owner,
    aiohttp_client: AiohttpClient,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = webhook_app(owner)[0]
    client = await aiohttp_client(app)

    class Broken:
        # The store in every other respect (the probes and metrics read it), with a failing
        # plan.
        def __init__(self, store: Any) -> None:
            self.store = store

        def __getattr__(self, name: str) -> Any:
            return getattr(self.store, name)

        def plan_text(self, *_: Any, **__: Any) -> Any:
            raise RuntimeError("a bug")

    monkeypatch.setattr(app[RUNTIME], "store", Broken(app[RUNTIME].store))
    with caplog.at_level("INFO", "webhook.app"):
        resp = await client.post("/v1/plan", json=request())
    assert resp.status == 500
    assert resp.content_type == "application/json"
    assert await resp.json() == {
        "status": 500,
        "detail": "the plan could not be made (internal error; see the webhook's log)",
        "code": "internal-error",
    }
    [line] = lines(caplog, "webhook.app")
    assert (line["level"], line["code"]) == ("ERROR", "internal-error")
    assert line["exc"].endswith("RuntimeError: a bug")
    text = await (await client.get("/metrics")).text()
    assert (
        'tmi_webhook_decisions_total{endpoint="plan",outcome="error",reason="internal-error",'
        'status="500"} 1.0'
    ) in text


# -- the extender --------------------------------------------------------------------------------


async def test_extender_filter_logs_a_summary_and_each_refused_node(
    owner: Owner, aiohttp_client: AiohttpClient, caplog: pytest.LogCaptureFixture
) -> None:
    envelope = extenderkit.fleet_envelope(owner)
    plan = extenderkit.plan_for(
        owner, envelope, request(inferenceResources=extenderkit.block("nvidia-whole"))
    )
    app, _ = extenderkit.extender_app(owner, nodes=FLEET)
    client = await aiohttp_client(app)
    pod = extenderkit.planned_pod(plan)
    with caplog.at_level("DEBUG", "extender.app"):
        resp = await client.post("/filter", json=extenderkit.cache_args(pod, ALL))
        assert resp.status == 200
    result = await resp.json()
    [summary, *per_node] = lines(caplog, "extender.app")
    assert summary["level"] == "INFO" and summary["msg"] == "filter answered"
    meta = pod["metadata"]
    assert (summary["namespace"], summary["pod"], summary["uid"]) == (
        meta["namespace"],
        meta["name"],
        meta["uid"],
    )
    assert (summary["outcome"], summary["nodes"], summary["passed"], summary["failed"]) == (
        "planned",
        len(ALL),
        3,
        len(ALL) - 3,
    )
    assert summary["codes"] == {
        "resource-absent": 2,
        "cuda-driver": 2,
        "compute-capability": 1,
        "gfd-missing": 1,
        "arch": 1,
        "mig-strategy": 1,
    }
    assert "error" not in summary
    refused = {line["node"]: line for line in per_node}
    assert set(refused) == set(ALL) - set(result["NodeNames"])
    assert refused["gh200"]["code"] == "arch" and refused["gh200"]["level"] == "DEBUG"
    assert refused["gh200"]["detail"] == result["FailedAndUnresolvableNodes"]["gh200"]
    assert refused["a100-mig"]["code"] == "resource-absent"
    assert refused["a100-mig"]["uid"] == meta["uid"]


async def test_extender_filter_at_info_writes_no_per_node_lines(
    owner: Owner, aiohttp_client: AiohttpClient, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = extenderkit.extender_app(owner, nodes=FLEET)
    client = await aiohttp_client(app)
    unplanned = extenderkit.planned_pod(None)
    with caplog.at_level("INFO", "extender.app"):
        await client.post("/filter", json=extenderkit.cache_args(unplanned, ALL))
        await client.post("/prioritize", json=extenderkit.cache_args(unplanned, ALL))
    # At INFO the filter's line is the decision; the scores are DEBUG detail.
    (filtered,) = lines(caplog, "extender.app")
    assert (filtered["outcome"], filtered["passed"], filtered["codes"]) == (
        "unplanned",
        len(ALL),
        {},
    )
    caplog.clear()
    with caplog.at_level("DEBUG", "extender.app"):
        await client.post("/prioritize", json=extenderkit.cache_args(unplanned, ALL))
    (prioritized,) = lines(caplog, "extender.app")
    assert prioritized["level"] == "DEBUG"
    assert (prioritized["msg"], prioritized["nodes"], prioritized["best"]) == (
        "prioritize answered",
        len(ALL),
        None,
    )


# -- the controller ------------------------------------------------------------------------------


async def test_controller_logs_each_condition_patch(
    owner: Owner, caplog: pytest.LogCaptureFixture
) -> None:
    kube = MemoryKube(NAMESPACE)
    kube.put("configmaps", owner.sign(name="kamiwaza-inference-profiles-r1"))
    document = request()
    decided = owner.state().decide(document, NOW)
    pod = planned_pod("tmi-1", document, decided.body, created="2026-11-29T12:00:00Z")
    bind(pod, at="2026-11-29T12:00:00Z")
    pod = kube.put("pods", pod)
    policy = PolicyView(owner.settings())
    for configmap in kube.objects["configmaps"].values():
        policy.apply_configmap(configmap)
    reconciler = Reconciler(kube, policy, ReconcileSettings(instance="t"), clock=lambda: NOW)
    with caplog.at_level("INFO", "allocation_controller.reconciler"):
        assert (await reconciler.reconcile("tmi-1")).outcome == "written"
        # Nothing changed: nothing patched, nothing logged.
        assert (await reconciler.reconcile("tmi-1")).outcome == "unchanged"
    [line] = lines(caplog, "allocation_controller.reconciler")
    assert line["msg"] == "condition patched"
    assert {k: line[k] for k in ("pod", "namespace", "uid", "verdict", "code", "binding")} == {
        "pod": "tmi-1",
        "namespace": NAMESPACE,
        "uid": pod["metadata"]["uid"],
        "verdict": "True",
        "code": "Verified",
        "binding": decided.body["bindingId"],
    }
