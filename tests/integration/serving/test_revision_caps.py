"""Tenant junk past the caps (`policy_io.caps`), through the informers every server follows
revisions with, into the allocation controller on the in-memory API server: the junk is refused
with the cap's message, counted, told as Events on the ConfigMaps, kept as its identity alone,
and the owner's verified revision still verifies Pods, those already verified and new ones.
Then the informers' own store after a relist, and the extender's and webhook's counter.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import generate_latest

from allocation_controller.capped import EVENT_REASON
from allocation_controller.config import ControllerSettings
from allocation_controller.controller import Controller
from inference_policy.granting.grant import CONDITION_TYPE
from inference_policy.trust.signing import BUNDLE_KEY, DIGEST_KEY
from kits import polling
from kits.controllerkit import MemoryKube
from kits.podstates import bind, planned_pod
from kits.profilekit import NAMESPACE, NOW, Owner, request
from policy_io import caps
from policy_io.catalog import packaged_catalog
from policy_io.state import PROFILE_LABEL, PolicyState
from serving.metrics import profile_gauges

PROFILE_NAME = "kamiwaza-inference-profiles-r1"
CREATED = "2026-11-29T12:00:00Z"
MAX_BYTES = 64 * 1024
MAX_REVISIONS = 4


def junk(name: str, size: int) -> dict[str, Any]:
    """A labelled ConfigMap the tenant's namespace admin may write: `size` bytes of junk in a
    bundle with its true sha256."""
    bundle = json.dumps({"payloadType": "j" * size, "payload": "", "signatures": []})
    return {
        "metadata": {"name": name, "labels": {PROFILE_LABEL: "true"}},
        "immutable": True,
        "data": {BUNDLE_KEY: bundle, DIGEST_KEY: hashlib.sha256(bundle.encode()).hexdigest()},
    }


def verdict(kube: MemoryKube, name: str) -> dict[str, Any] | None:
    pod = kube.get("pods", name)
    assert pod is not None
    found = [
        c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == CONDITION_TYPE
    ]
    return found[0] if found else None


def add_pod(kube: MemoryKube, owner: Owner, name: str) -> None:
    document = request()
    decision = owner.state().decide(document, NOW)
    assert decision.allowed, decision.body
    pod = planned_pod(name, document, decision.body, created=CREATED)
    bind(pod, at=CREATED)
    kube.put("pods", pod)


@pytest.fixture
def owner() -> Owner:
    return Owner()


@pytest.fixture
async def started(owner: Owner) -> AsyncIterator[tuple[MemoryKube, Controller]]:
    kube = MemoryKube(NAMESPACE)
    kube.put("configmaps", owner.sign(name=PROFILE_NAME))
    policy = owner.settings(max_profile_revisions=MAX_REVISIONS, max_revision_bytes=MAX_BYTES)
    loop = asyncio.get_running_loop()
    begun = loop.time()
    controller = Controller(
        kube,
        ControllerSettings(policy=policy, leader_elect=False, workers=2),
        clock=lambda: NOW + timedelta(seconds=loop.time() - begun),
    )
    stop = asyncio.Event()
    task = loop.create_task(controller.run(stop))
    yield kube, controller
    stop.set()
    await asyncio.wait_for(task, 10)


async def eventually(check: Any, what: str) -> Any:
    return await polling.eventually(check, what=what, timeout=10)


async def test_junk_past_the_caps_is_refused_counted_and_told_and_the_owners_revision_verifies(
    started: tuple[MemoryKube, Controller], owner: Owner
) -> None:
    kube, controller = started
    add_pod(kube, owner, "tmi-1")
    await eventually(lambda: (verdict(kube, "tmi-1") or {}).get("reason") == "Verified", "tmi-1")
    verified = verdict(kube, "tmi-1")
    followed = controller.policy.feed.state.followed

    # Ten too large, twenty small and refused, six copies of the owner's own bundle (three are
    # kept, the cap is four, the rest refused unverified), one rewritten twenty times.
    for index in range(10):
        kube.put("configmaps", junk(f"large-{index}", MAX_BYTES + 1000))
    for index in range(20):
        kube.put("configmaps", junk(f"small-{index}", 100))
    for index in range(6):
        kube.put("configmaps", owner.sign(name=f"copy-{index}"))
    for _ in range(20):
        kube.put("configmaps", junk("looped", 200))
    await eventually(
        lambda: sum(followed.refused_total.values()) == 10 + 20 + 3 + 20, "every junk judged"
    )
    assert followed.refused_total == {caps.TOO_LARGE: 10, caps.TOO_MANY: 3, caps.UNVERIFIED: 40}

    # The owner's revision is the one in use; the Pod verified before is untouched, and a new one
    # is verified under it.
    snapshot = controller.policy.feed.snapshot
    assert snapshot.profile is not None and snapshot.profile.configmap_name == PROFILE_NAME
    add_pod(kube, owner, "tmi-2")
    await eventually(lambda: (verdict(kube, "tmi-2") or {}).get("reason") == "Verified", "tmi-2")
    # (A copy of the owner's bundle under a name sorting first is named in the message: the
    # same revision, by digest.)
    after = verdict(kube, "tmi-1")
    assert after is not None and verified is not None
    kept = ("status", "reason", "lastTransitionTime")
    assert {k: after[k] for k in kept} == {k: verified[k] for k in kept}

    # Each cap refusal is an Event on its ConfigMap naming the cap; the verifier's are not.
    await eventually(lambda: len(controller.capped._tasks) == 0, "the Events posted")
    told = {e["regarding"]["name"]: e["note"] for e in kube.events if e["reason"] == EVENT_REASON}
    assert set(told) == {f"large-{i}" for i in range(10)} | {"copy-3", "copy-4", "copy-5"}
    assert "over the cap of 65536 bytes on a profile revision" in told["large-0"]
    assert "ConfigMap 'large-0' carries" in told["large-0"]
    assert "holds more than 4 signed profile revisions" in told["copy-5"]
    assert all(
        e["regarding"]["kind"] == "ConfigMap" for e in kube.events if e["reason"] == EVENT_REASON
    )

    text = generate_latest(controller.metrics.registry).decode()
    assert 'tmi_allocation_profile_revisions_refused_total{reason="too-large"} 10.0' in text
    assert 'tmi_allocation_profile_revisions_refused_total{reason="too-many"} 3.0' in text
    assert 'tmi_allocation_profile_revisions_refused_total{reason="unverified"} 40.0' in text

    # What the informer keeps of every labelled ConfigMap is its identity and digest.
    [informer] = [i for i in controller.policy_informers if i.collection.label_selector]
    stored = list(informer.store.values())
    assert len(stored) == 1 + 10 + 20 + 6 + 1
    assert all(set(o.get("data") or {}) <= {DIGEST_KEY} for o in stored)
    assert max(len(json.dumps(o)) for o in stored) < 512

    # A relist (the watch compacted away) judges nothing again.
    verifications = followed.verifications
    kube.compact()
    kube.close_watches()
    await eventually(lambda: informer.lists >= 2, "a relist")
    assert followed.verifications == verifications
    assert controller.policy.feed.snapshot.profile is not None


def test_the_extender_and_the_webhook_count_refused_revisions_of_every_tenant(owner: Owner) -> None:
    first, second = (
        PolicyState(owner.settings(namespace=n), packaged_catalog()) for n in ("a", "b")
    )
    first.followed.apply("big", junk("big", caps.MAX_REVISION_BYTES), owner.policy())
    second.followed.apply("small", junk("small", 10), owner.policy())
    [*_, family] = profile_gauges("tmi_extender", first, NOW, refused=[first, second])
    counts = {s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total")}
    assert family.name == "tmi_extender_profile_revisions_refused"
    assert counts == {caps.TOO_LARGE: 1.0, caps.TOO_MANY: 0.0, caps.UNVERIFIED: 1.0}
