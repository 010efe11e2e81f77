"""The allocation controller when the tenant takes its rights away, against the in-memory API
server (`kits.controllerkit.MemoryKube`, whose `forbidden` operations RBAC refuses and whose
SelfSubjectAccessReviews answer accordingly).

A controller that may no longer list, watch or get the namespace's Pods, or patch their status,
cannot keep its verdicts (`inference_policy.granting.owner_rights`). It says so (the
`tmi_allocation_rights_missing` gauge, a log line, an Event in the owner's namespace regarding
its own Pod), stays ready, keeps retrying, and clears all of it, then catches up on the Pods,
once the rights are back.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from allocation_controller.app import create_app
from allocation_controller.config import settings_from_args
from allocation_controller.ports import ApiError
from allocation_controller.rights import CONFIRMED, MISSING, RESTORED
from inference_policy.granting.owner_rights import CONTROLLER_RIGHTS
from kits.controllerkit import RIGHT_OPERATIONS, MemoryKube
from kits.profilekit import NAMESPACE, Owner
from tests.integration.controller.test_controller import (
    PROFILE_NAME,
    Running,
    add_pod,
    controller_settings,
    eventually,
    reason_of,
    set_image,
    verdict_of,
)

OWNER_NS = "tmi-owner"
POD = "tmi-allocation-controller-7f9c-abcde"
EVERY = frozenset(RIGHT_OPERATIONS.values())


@pytest.fixture(scope="module")
def owner() -> Owner:
    return Owner()


@pytest.fixture
def kube(owner: Owner) -> MemoryKube:
    kube = MemoryKube(NAMESPACE)
    kube.put("configmaps", owner.sign(name=PROFILE_NAME))
    return kube


@pytest.fixture
async def start(kube: MemoryKube, owner: Owner) -> AsyncIterator[Callable[..., Running]]:
    started: list[Running] = []

    def run(rights_seconds: float = 0.2) -> Running:
        settings = controller_settings(
            owner.settings(),
            rights_seconds=rights_seconds,
            pod_name=POD,
            lease_namespace=OWNER_NS,
        )
        instance = Running(kube, settings)
        started.append(instance)
        return instance

    yield run
    for instance in started:
        if not instance.task.done():
            await instance.close()


def missing(instance: Running, resource: str, verb: str) -> float | None:
    """The controller's gauge for one right (None: no answer yet)."""
    return instance.controller.metrics.registry.get_sample_value(
        "tmi_allocation_rights_missing",
        {"namespace": NAMESPACE, "resource": resource, "verb": verb},
    )


def reasons(kube: MemoryKube) -> list[str]:
    return [event["reason"] for event in kube.owner_events]


async def test_a_withdrawn_binding_is_reported_and_cleared_when_restored(
    kube: MemoryKube, owner: Owner, start: Callable[..., Running], caplog: Any
) -> None:
    add_pod(kube, owner)
    instance = start()
    await eventually(lambda: reason_of(kube, "tmi-1") == "Verified")
    await eventually(lambda: reasons(kube) == [CONFIRMED])
    assert all(missing(instance, r.resource_path, r.verb) == 0 for r in CONTROLLER_RIGHTS)

    # The tenant deletes the RoleBinding; the open watch ends and the next one is refused. Then
    # it changes the verified Pod's image.
    caplog.set_level(logging.WARNING, logger="allocation_controller.rights")
    kube.forbidden |= EVERY
    kube.close_watches()
    kube.mutate("pods", "tmi-1", set_image("registry.invalid/other:1"))
    await eventually(lambda: MISSING in reasons(kube))
    for right in CONTROLLER_RIGHTS:
        assert missing(instance, right.resource_path, right.verb) == 1
    event = kube.owner_events[-1]
    assert event["type"] == "Warning"
    assert event["metadata"]["namespace"] == OWNER_NS
    assert event["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": OWNER_NS,
        "name": POD,
    }
    assert event["note"].startswith(
        f"the allocation controller may not list pods, watch pods, get pods, patch pods/status "
        f"in namespace '{NAMESPACE}'"
    )
    assert f"RoleBinding tmi-allocation-controller in namespace '{NAMESPACE}'" in event["note"]
    [line] = [r for r in caplog.records if getattr(r, "code", None) == MISSING]
    assert line.namespace == NAMESPACE
    assert line.missing == [str(r) for r in CONTROLLER_RIGHTS]
    # Ready still, saying why; the condition it can no longer write is what it was.
    assert instance.controller.synced
    client = TestClient(TestServer(create_app(instance.controller)))
    await client.start_server()
    try:
        ready = await client.get("/readyz")
        text = await ready.text()
        assert ready.status == 200 and "may not list pods" in text
    finally:
        await client.close()
    assert reason_of(kube, "tmi-1") == "Verified"

    # The owner restores the binding: the gauge clears, an Event says so, and the Pod the
    # controller could not follow is checked again on the relist.
    kube.forbidden.clear()
    await eventually(lambda: reasons(kube)[-1] == RESTORED)
    assert reasons(kube) == [CONFIRMED, MISSING, RESTORED]
    assert all(missing(instance, r.resource_path, r.verb) == 0 for r in CONTROLLER_RIGHTS)
    await eventually(lambda: reason_of(kube, "tmi-1") == "ImageMismatch", timeout=15)
    assert not instance.controller.rights.missing


async def test_a_refused_status_patch_is_reported_at_once(
    kube: MemoryKube, owner: Owner, start: Callable[..., Running]
) -> None:
    """Only the Role's pods/status rule is removed: the watch still runs, the verdict's patch is
    refused, and that refusal alone (not the next round) brings the report."""
    # No round is due for an hour after the first: only the refusal can bring the next.
    instance = start(rights_seconds=3600.0)
    await eventually(lambda: reasons(kube) == [CONFIRMED])
    kube.forbidden.add("patch_pod_status")
    add_pod(kube, owner)
    await eventually(lambda: MISSING in reasons(kube))
    assert missing(instance, "pods/status", "patch") == 1
    assert missing(instance, "pods", "list") == 0
    assert instance.controller.rights.rounds == 2
    assert "may not patch pods/status" in kube.owner_events[-1]["note"]
    assert verdict_of(kube, "tmi-1") is None
    # Back: the Pod's own retry writes its verdict (the report waits for its next round).
    kube.forbidden.clear()
    await eventually(lambda: reason_of(kube, "tmi-1") == "Verified", timeout=15)


async def test_a_controller_started_without_its_rights_is_ready_and_catches_up(
    kube: MemoryKube, owner: Owner, start: Callable[..., Running]
) -> None:
    add_pod(kube, owner)
    kube.forbidden |= EVERY
    instance = start()
    await eventually(lambda: reasons(kube) == [MISSING])
    await eventually(lambda: instance.controller.synced)
    assert instance.controller.pods_refused
    assert kube.patches == []
    kube.forbidden.clear()
    await eventually(lambda: reasons(kube) == [MISSING, RESTORED])
    await eventually(lambda: reason_of(kube, "tmi-1") == "Verified", timeout=15)
    assert not instance.controller.pods_refused


async def test_credentials_refused_count_as_every_right_missing(
    kube: MemoryKube, owner: Owner, start: Callable[..., Running]
) -> None:
    kube.fail_next("review_access", ApiError(401, "Unauthorized", ""), times=len(EVERY))
    start()
    await eventually(lambda: reasons(kube)[:1] == [MISSING])
    assert (
        "may not list pods, watch pods, get pods, patch pods/status"
        in (kube.owner_events[0]["note"])
    )
    await eventually(lambda: reasons(kube) == [MISSING, RESTORED])


def test_the_rights_interval_and_pod_name_are_settings(owner: Owner) -> None:
    settings = settings_from_args(
        [
            "--namespace=kamiwaza",
            f"--owner-public-key={owner.public_key}",
            "--cluster-binding-id=cluster-a",
            "--rights-seconds=7",
        ],
        {"POD_NAME": POD},
    )
    assert (settings.rights_seconds, settings.pod_name) == (7.0, POD)
    assert settings_from_args(
        [
            "--namespace=kamiwaza",
            f"--owner-public-key={owner.public_key}",
            "--cluster-binding-id=cluster-a",
        ],
        {},
    ).rights_seconds == pytest.approx(15.0)
