"""The allocation controller against the in-memory API server (allocation_controller.memory).

Two levels. The `Reconciler` alone, over the fake's Pod port: honest and tampered Pods, the
scheduling deadline, re-checks on change, no redundant patches or Events, optimistic
concurrency, a restart that writes nothing new, revisions found by digest. Then the whole
`Controller` (informers, work queue, timers, leader election): a Pod bound after start is
verified through the watch; the deadline fires from a timer; a profile published after the Pod
re-checks it; a compacted watch relists; a restarted controller resumes; two controllers on one
Lease never both write. Leader election is also tested on its own with fake clocks, including a
randomised interleaving check that two electors are never leader at once. Last, the HTTP probes
and the settings parser.
"""

from __future__ import annotations

import asyncio
import copy
import random
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from allocation_controller.app import create_app
from allocation_controller.config import (
    FAULT_PAUSE_VARIABLE,
    ControllerSettings,
    settings_from_args,
)
from allocation_controller.controller import Controller
from allocation_controller.leader import LeaderElector, LeaderSettings
from allocation_controller.ports import ApiError, Conflict
from allocation_controller.reconciler import NotLeader, Reconciler, ReconcileSettings
from allocation_controller.revisions import PolicyView
from inference_policy.granting.grant import CONDITION_TYPE
from inference_policy.planning.recipes import render_catalog
from kits import polling
from kits.controllerkit import MemoryKube
from kits.podstates import bind, planned_pod, unschedulable
from kits.profilekit import NAMESPACE, NOW, Owner, request
from policy_io.state import PROFILE_SELECTOR, PolicySettings
from serving.informer import Collection, Page
from serving.settings import ConfigError

CREATED = "2026-11-29T12:00:00Z"
ENGINE = "kamiwaza.ai/deployment-id"
PROFILE_NAME = "kamiwaza-inference-profiles-r1"


class Clock:
    """A wall clock the test moves by hand."""

    def __init__(self, start: datetime = NOW) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture(scope="module")
def owner() -> Owner:
    return Owner()


@pytest.fixture(scope="module")
def policy_settings(owner: Owner) -> PolicySettings:
    return owner.settings()


@pytest.fixture
def kube(owner: Owner) -> MemoryKube:
    kube = MemoryKube(NAMESPACE)
    kube.put("configmaps", owner.sign(name=PROFILE_NAME))
    return kube


def plan_for(owner: Owner, document: dict[str, Any]) -> dict[str, Any]:
    decision = owner.state().decide(document, NOW)
    assert decision.allowed, decision.body
    return decision.body


def add_pod(
    kube: MemoryKube, owner: Owner, name: str = "tmi-1", *, bound: bool = True, **req: Any
) -> dict[str, Any]:
    document = request(**req)
    pod = planned_pod(name, document, plan_for(owner, document), created=CREATED)
    if bound:
        bind(pod, at=CREATED)
    return kube.put("pods", pod)


def make_policy(kube: MemoryKube, settings: PolicySettings) -> PolicyView:
    policy = PolicyView(settings)
    for configmap in kube.objects["configmaps"].values():
        policy.apply_configmap(configmap)
    return policy


def make_reconciler(
    kube: MemoryKube,
    settings: PolicySettings,
    clock: Clock,
    *,
    timeout: float = 300,
    may_write: Callable[[], bool] | None = None,
) -> Reconciler:
    return Reconciler(
        kube,
        make_policy(kube, settings),
        ReconcileSettings(scheduling_timeout=timeout, instance="test-0"),
        clock=clock,
        may_write=may_write,
    )


def verdict_of(kube: MemoryKube, name: str) -> dict[str, Any] | None:
    pod = kube.get("pods", name)
    assert pod is not None
    for entry in (pod.get("status") or {}).get("conditions") or []:
        if entry["type"] == CONDITION_TYPE:
            return dict(entry)
    return None


def set_image(image: str) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        pod["spec"]["containers"][0]["image"] = image

    return change


# -- the reconciler ------------------------------------------------------------------------------


async def test_honest_pod_is_verified_by_a_strategic_merge_patch(
    kube: MemoryKube, owner: Owner, policy_settings: PolicySettings
) -> None:
    add_pod(kube, owner)
    reconciler = make_reconciler(kube, policy_settings, Clock())
    result = await reconciler.reconcile("tmi-1")
    assert result.outcome == "written"
    condition = verdict_of(kube, "tmi-1")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "Verified")
    assert condition["lastTransitionTime"] == "2026-11-29T12:00:00Z"
    [patch] = kube.patches
    assert set(patch.body) == {"metadata", "status"}
    assert [c["type"] for c in patch.body["status"]["conditions"]] == [CONDITION_TYPE]
    assert patch.body["metadata"]["resourceVersion"]
    # The scheduler's condition is still there: the patch merged by type.
    pod = kube.get("pods", "tmi-1")
    assert pod is not None
    assert {c["type"] for c in pod["status"]["conditions"]} == {"PodScheduled", CONDITION_TYPE}
    [event] = kube.events
    assert (event["type"], event["reason"], event["action"]) == (
        "Normal",
        "Verified",
        "VerifyAllocation",
    )
    assert event["regarding"]["name"] == "tmi-1"
    assert event["reportingController"] == "kamiwaza.ai/allocation-controller"
    # Revision expiry is the next time-driven change; timers are capped at a day.
    assert result.requeue_after == 86400


async def test_the_fault_injection_pause_holds_the_verdict_between_leader_check_and_patch(
    kube: MemoryKube, owner: Owner, policy_settings: PolicySettings
) -> None:
    """The window the e2e fault test kills a replica in: decided, leader checked, not written."""
    add_pod(kube, owner)
    checks: list[bool] = []

    def may_write() -> bool:
        checks.append(True)
        return True

    reconciler = Reconciler(
        kube,
        make_policy(kube, policy_settings),
        ReconcileSettings(instance="test-0", pause_before_patch=0.5),
        clock=Clock(),
        may_write=may_write,
    )
    task = asyncio.get_running_loop().create_task(reconciler.reconcile("tmi-1"))
    # The leader has been asked, so the verdict is decided; the pause holds its patch back.
    await polling.eventually(lambda: checks, what="the reconcile to ask whether it may write")
    assert not kube.patches and not task.done()
    assert (await task).outcome == "written"
    assert len(kube.patches) == 1


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (set_image("registry.invalid/evil@sha256:" + "e" * 64), "ImageMismatch"),
        (
            lambda pod: pod["spec"]["containers"][0]["resources"]["limits"].update(
                {"nvidia.com/mig-3g.40gb": "3"}
            ),
            "ResourcesMismatch",
        ),
        (
            lambda pod: pod["spec"]["containers"][1].update(
                {"resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ),
            "ResourcesMismatch",
        ),
        (lambda pod: pod["spec"].update({"runtimeClassName": "runc"}), "RuntimeClassMismatch"),
        (lambda pod: pod["spec"].pop("runtimeClassName"), "RuntimeClassMismatch"),
        (
            lambda pod: pod["spec"].update({"nodeSelector": {"kubernetes.io/arch": "arm64"}}),
            "NodeSelectorMismatch",
        ),
    ],
)
async def test_tampered_pod_is_refused_with_the_reason(
    kube: MemoryKube,
    owner: Owner,
    policy_settings: PolicySettings,
    change: Callable[[dict[str, Any]], None],
    reason: str,
) -> None:
    add_pod(kube, owner)
    kube.mutate("pods", "tmi-1", change)
    await make_reconciler(kube, policy_settings, Clock()).reconcile("tmi-1")
    condition = verdict_of(kube, "tmi-1")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", reason)
    assert kube.events[-1]["type"] == "Warning"
    assert kube.events[-1]["reason"] == reason


async def test_unscheduled_pod_waits_then_reports_the_scheduler_message(
    kube: MemoryKube, owner: Owner, policy_settings: PolicySettings
) -> None:
    add_pod(kube, owner, bound=False)
    said = "0/3 nodes are available: 3 Insufficient nvidia.com/mig-3g.40gb."
    kube.mutate("pods", "tmi-1", lambda pod: unschedulable(pod, said, CREATED))
    clock = Clock()
    reconciler = make_reconciler(kube, policy_settings, clock, timeout=300)
    clock.advance(120)
    result = await reconciler.reconcile("tmi-1")
    assert result.outcome == "waiting"
    assert result.requeue_after == pytest.approx(180)
    assert kube.patches == []
    clock.advance(181)
    result = await reconciler.reconcile("tmi-1")
    condition = verdict_of(kube, "tmi-1")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "SchedulingTimeout")
    assert said in condition["message"]
    assert result.requeue_after is None
    # Bound at last: the grant check takes over and the status flips.
    kube.mutate("pods", "tmi-1", lambda pod: bind(pod, at="2026-11-29T12:06:00Z"))
    clock.advance(60)
    await reconciler.reconcile("tmi-1")
    condition = verdict_of(kube, "tmi-1")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "Verified")
    assert condition["lastTransitionTime"] == "2026-11-29T12:06:01Z"
    assert [e["reason"] for e in kube.events] == ["SchedulingTimeout", "Verified"]


async def test_recheck_on_change_and_transition_times(
    kube: MemoryKube, owner: Owner, policy_settings: PolicySettings
) -> None:
    pod = add_pod(kube, owner)
    image = pod["spec"]["containers"][0]["image"]
    clock = Clock()
    reconciler = make_reconciler(kube, policy_settings, clock)
    await reconciler.reconcile("tmi-1")
    clock.advance(30)
    kube.mutate("pods", "tmi-1", set_image("registry.invalid/other@sha256:" + "1" * 64))
    await reconciler.reconcile("tmi-1")
    condition = verdict_of(kube, "tmi-1")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "ImageMismatch")
    assert condition["lastTransitionTime"] == "2026-11-29T12:00:30Z"
    clock.advance(30)
    kube.mutate("pods", "tmi-1", set_image(image))
    await reconciler.reconcile("tmi-1")
    condition = verdict_of(kube, "tmi-1")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "Verified")
    assert condition["lastTransitionTime"] == "2026-11-29T12:01:00Z"
    assert [e["reason"] for e in kube.events] == ["Verified", "ImageMismatch", "Verified"]


async def test_no_redundant_patches_and_message_changes_keep_the_transition_time(
    kube: MemoryKube, owner: Owner, policy_settings: PolicySettings
) -> None:
    add_pod(kube, owner)
    clock = Clock()
    reconciler = make_reconciler(kube, policy_settings, clock)
    await reconciler.reconcile("tmi-1")
    for _ in range(3):
        clock.advance(10)
        assert (await reconciler.reconcile("tmi-1")).outcome == "unchanged"
    # Kubelet-style status churn changes nothing either.
    kube.mutate("pods", "tmi-1", lambda pod: pod["status"].update({"phase": "Running"}))
    assert (await reconciler.reconcile("tmi-1")).outcome == "unchanged"
    assert len(kube.patches) == 1
    # Same status and reason, another message (another image): patched, no Event, same time.
    kube.mutate("pods", "tmi-1", set_image("registry.invalid/a@sha256:" + "a" * 64))
    await reconciler.reconcile("tmi-1")
    first = verdict_of(kube, "tmi-1")
    kube.mutate("pods", "tmi-1", set_image("registry.invalid/b@sha256:" + "b" * 64))
    clock.advance(10)
    await reconciler.reconcile("tmi-1")
    second = verdict_of(kube, "tmi-1")
    assert first is not None and second is not None
    assert first["message"] != second["message"]
    assert first["lastTransitionTime"] == second["lastTransitionTime"]
    assert len(kube.patches) == 3
    assert [e["reason"] for e in kube.events] == ["Verified", "ImageMismatch"]


async def test_a_restarted_reconciler_writes_nothing_new(
    kube: MemoryKube, owner: Owner, policy_settings: PolicySettings
) -> None:
    for i in range(5):
        add_pod(kube, owner, f"tmi-{i}")
    add_pod(kube, owner, "tmi-late", bound=False)
    clock = Clock(NOW + timedelta(seconds=400))
    first = make_reconciler(kube, policy_settings, clock)
    for name in list(kube.objects["pods"]):
        await first.reconcile(name)
    patches, events = len(kube.patches), len(kube.events)
    assert patches == 6
    second = make_reconciler(kube, policy_settings, clock)
    outcomes = [(await second.reconcile(name)).outcome for name in list(kube.objects["pods"])]
    assert outcomes == ["unchanged"] * 6
    assert (len(kube.patches), len(kube.events)) == (patches, events)


async def test_conflict_rereads_the_pod_and_decides_again(
    kube: MemoryKube, owner: Owner, policy_settings: PolicySettings
) -> None:
    add_pod(kube, owner)
    kube.fail_next("patch_pod_status", Conflict(409, "Conflict", "modified"))
    result = await make_reconciler(kube, policy_settings, Clock()).reconcile("tmi-1")
    assert result.outcome == "written"
    assert kube.calls["patch_pod_status"] == 2
    assert len(kube.events) == 1


async def test_stale_pod_version_is_a_conflict_not_a_wrong_verdict(
    kube: MemoryKube, owner: Owner, policy_settings: PolicySettings
) -> None:
    """The verdict computed on version N is never written onto version N+1."""
    add_pod(kube, owner)
    stale = kube.get("pods", "tmi-1")
    kube.mutate("pods", "tmi-1", set_image("registry.invalid/x@sha256:" + "3" * 64))

    class StalePort(MemoryKube):
        async def get_pod(self, name: str, *, fresh: bool = False) -> dict[str, Any] | None:
            return kube.get("pods", name) if fresh else copy.deepcopy(stale)

    port = StalePort(NAMESPACE)
    port.objects, port.patches, port.events = kube.objects, kube.patches, kube.events
    reconciler = Reconciler(port, make_policy(kube, policy_settings), clock=Clock())
    await reconciler.reconcile("tmi-1")
    condition = verdict_of(kube, "tmi-1")
    assert condition is not None and condition["reason"] == "ImageMismatch"


async def test_a_replica_that_may_not_write_writes_nothing(
    kube: MemoryKube, owner: Owner, policy_settings: PolicySettings
) -> None:
    add_pod(kube, owner)
    reconciler = make_reconciler(kube, policy_settings, Clock(), may_write=lambda: False)
    with pytest.raises(NotLeader):
        await reconciler.reconcile("tmi-1")
    assert kube.patches == [] and kube.events == []


async def test_pods_are_checked_against_the_revision_they_were_planned_with(
    kube: MemoryKube, owner: Owner, policy_settings: PolicySettings
) -> None:
    add_pod(kube, owner, "old")
    # A later revision that would plan the same request on CPU.
    later = owner.envelope(version=2)
    later["profiles"] = [p for p in later["profiles"] if p["capability"] == "cpu"]
    kube.put("configmaps", owner.sign(later, name="kamiwaza-inference-profiles-r2"))
    reconciler = make_reconciler(kube, policy_settings, Clock())
    assert len(reconciler.policy.revisions) == 2
    await reconciler.reconcile("old")
    condition = verdict_of(kube, "old")
    assert condition is not None and condition["reason"] == "Verified"
    assert PROFILE_NAME in condition["message"]
    # The old revision is retired: the verified Pod keeps running, verified, and says why.
    reconciler.policy.remove_configmap(PROFILE_NAME)
    await reconciler.reconcile("old")
    condition = verdict_of(kube, "old")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "VerifiedRevisionUnavailable")
    # A new Pod planned under the retired revision is not vouched for.
    add_pod(kube, owner, "new")
    await reconciler.reconcile("new")
    condition = verdict_of(kube, "new")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "ProfileRevisionUnknown")


async def test_revisions_verify_once_per_version_and_refusals_are_reported(
    kube: MemoryKube, owner: Owner, policy_settings: PolicySettings
) -> None:
    policy = make_policy(kube, policy_settings)
    configmap = kube.objects["configmaps"][PROFILE_NAME]
    for _ in range(5):
        assert policy.apply_configmap(configmap) == set()
    assert policy.verifications == 1
    stranger = Owner()
    kube.put("configmaps", stranger.sign(name="kamiwaza-inference-profiles-x"))
    digest = kube.objects["configmaps"]["kamiwaza-inference-profiles-x"]["data"]["bundle.sha256"]
    document = request()
    plan = stranger.state().decide(document, NOW).body
    pod = planned_pod("foreign", document, plan, created=CREATED)
    bind(pod, at=CREATED)
    kube.put("pods", pod)
    reconciler = make_reconciler(kube, policy_settings, Clock())
    assert policy.apply_configmap(kube.objects["configmaps"]["kamiwaza-inference-profiles-x"]) == {
        digest
    }
    await reconciler.reconcile("foreign")
    condition = verdict_of(kube, "foreign")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "ProfileRefused")
    assert "signed by a key this cluster does not trust" in condition["message"]


async def test_expired_profile_policy(
    kube: MemoryKube, owner: Owner, policy_settings: PolicySettings
) -> None:
    add_pod(kube, owner, "verified")
    clock = Clock()
    reconciler = make_reconciler(kube, policy_settings, clock)
    await reconciler.reconcile("verified")
    clock.now = datetime(2027, 11, 1, 0, 0, 1, tzinfo=UTC)
    add_pod(kube, owner, "late")
    await reconciler.reconcile("verified")
    await reconciler.reconcile("late")
    verified, late = verdict_of(kube, "verified"), verdict_of(kube, "late")
    assert verified is not None and late is not None
    assert (verified["status"], verified["reason"]) == ("True", "VerifiedProfileExpired")
    assert (late["status"], late["reason"]) == ("False", "ProfileExpired")


# -- the whole controller ------------------------------------------------------------------------

FAST_LEADER = {"lease_duration": 1.5, "renew_deadline": 1.0, "retry_period": 0.1}


def controller_settings(
    policy_settings: PolicySettings, identity: str = "ctrl-0", **changes: Any
) -> ControllerSettings:
    values: dict[str, Any] = {
        "policy": policy_settings,
        "scheduling_timeout": 300.0,
        "leader": LeaderSettings(
            name="tmi-allocation-controller", identity=identity, **FAST_LEADER
        ),
        "workers": 2,
    }
    values.update(changes)
    return ControllerSettings(**values)


class Running:
    """A controller task with a stop switch and a clock that runs from NOW."""

    def __init__(self, kube: MemoryKube, settings: ControllerSettings) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.controller = Controller(
            kube,
            settings,
            clock=lambda: NOW + timedelta(seconds=loop.time() - start),
        )
        self.stop = asyncio.Event()
        self.task = loop.create_task(self.controller.run(self.stop))

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)


@pytest.fixture
async def running(
    kube: MemoryKube, policy_settings: PolicySettings
) -> AsyncIterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(identity: str = "ctrl-0", **changes: Any) -> Running:
        instance = Running(kube, controller_settings(policy_settings, identity, **changes))
        started.append(instance)
        return instance

    yield start
    for instance in started:
        if not instance.task.done():
            await instance.close()


async def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    """The first truthy `check()`, up to `timeout`; the timeout names the check's source line."""
    code = check.__code__
    what = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno} to hold"
    return await polling.eventually(check, what=what, timeout=timeout)


def reconciles(instance: Running, outcome: str) -> float:
    """How many reconciles of the running controller ended with `outcome`."""
    return float(instance.controller.metrics.reconciles.labels(outcome)._value.get())


def reason_of(kube: MemoryKube, name: str) -> str | None:
    condition = verdict_of(kube, name)
    return condition["reason"] if condition else None


async def test_controller_verifies_a_pod_bound_after_start(
    kube: MemoryKube, owner: Owner, running: Callable[..., Running]
) -> None:
    instance = running()
    await eventually(lambda: instance.controller.leading and instance.controller._workers)
    add_pod(kube, owner, bound=False)
    # Reconciled while unbound: it waits for its scheduling deadline, with nothing written.
    await eventually(lambda: reconciles(instance, "waiting") >= 1)
    assert kube.patches == []
    kube.mutate("pods", "tmi-1", lambda pod: bind(pod, at=CREATED))
    await eventually(lambda: reason_of(kube, "tmi-1") == "Verified")
    assert instance.controller.metrics.bind_to_verified._sum.get() > 0
    # Its own write comes back through the watch and causes nothing more: time passes on
    # purpose, for a second patch, if any, to be written meanwhile.
    await asyncio.sleep(0.1)
    assert len(kube.patches) == 1
    assert kube.calls.get("list_pods", 0) == 1


async def test_controller_reports_the_scheduling_timeout_from_a_timer(
    kube: MemoryKube, owner: Owner, running: Callable[..., Running]
) -> None:
    add_pod(kube, owner, bound=False)
    said = "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
    kube.mutate("pods", "tmi-1", lambda pod: unschedulable(pod, said, CREATED))
    instance = running(scheduling_timeout=0.4)
    await eventually(lambda: reason_of(kube, "tmi-1") == "SchedulingTimeout")
    condition = verdict_of(kube, "tmi-1")
    assert condition is not None and said in condition["message"]
    # One initial list and one wait on a timer: no polling of the API server.
    assert kube.calls.get("list_pods", 0) == 1
    assert instance.controller.reconciler.metrics.reconciles.labels("waiting")._value.get() <= 2


async def test_profile_published_after_the_pod_rechecks_it(
    owner: Owner, policy_settings: PolicySettings
) -> None:
    kube = MemoryKube(NAMESPACE)
    add_pod(kube, owner)
    instance = Running(kube, controller_settings(policy_settings))
    try:
        await eventually(lambda: reason_of(kube, "tmi-1") == "ProfileRevisionUnknown")
        kube.put("configmaps", owner.sign(name=PROFILE_NAME))
        await eventually(lambda: reason_of(kube, "tmi-1") == "Verified")
    finally:
        await instance.close()


async def test_compacted_watch_relists_and_keeps_going(
    kube: MemoryKube, owner: Owner, running: Callable[..., Running]
) -> None:
    add_pod(kube, owner, "a")
    instance = running()
    await eventually(lambda: reason_of(kube, "a") == "Verified")
    # The watch drops and, before it resumes, its version is compacted away: 410, relist.
    kube.close_watches()
    add_pod(kube, owner, "b")
    kube.compact()
    await eventually(lambda: reason_of(kube, "b") == "Verified")
    assert instance.controller.pods.lists >= 2


FORBIDDEN = ApiError(403, "Forbidden", 'configmaps is forbidden: cannot list resource "configmaps"')


def message_of(kube: MemoryKube, name: str) -> str:
    condition = verdict_of(kube, name)
    return condition["message"] if condition else ""


async def test_profiles_the_role_may_not_read_are_reported_on_each_pod_until_readable(
    kube: MemoryKube, owner: Owner, running: Callable[..., Running]
) -> None:
    # The first two lists of the profile ConfigMaps are refused, as a Role without them is.
    kube.fail_next("list_configmaps", FORBIDDEN, times=2)
    add_pod(kube, owner)
    instance = running()
    # Ready and checking Pods at once: the refusal is the owner's to fix, and each Pod says so.
    await eventually(lambda: reason_of(kube, "tmi-1") == "ProfilesUnreadable")
    assert instance.controller.synced
    expected = (
        f"ConfigMaps labelled {PROFILE_SELECTOR} in namespace '{NAMESPACE}' may not be read "
        "(HTTP 403; check the Role), so no plan can be checked against its revision"
    )
    assert message_of(kube, "tmi-1") == expected
    # Once a list succeeds, the profile it read is verified and the Pod with it.
    await eventually(lambda: reason_of(kube, "tmi-1") == "Verified", timeout=10)
    assert kube.calls["list_configmaps"] == 3


async def test_a_verified_pod_keeps_its_grant_while_the_profiles_may_not_be_read(
    kube: MemoryKube, owner: Owner, running: Callable[..., Running]
) -> None:
    add_pod(kube, owner)
    instance = running()
    await eventually(lambda: reason_of(kube, "tmi-1") == "Verified")
    # The watch drops, its version is compacted away, and the relist is refused.
    kube.fail_next("list_configmaps", FORBIDDEN)
    kube.close_watches()
    kube.compact()
    await eventually(lambda: reason_of(kube, "tmi-1") == "VerifiedRevisionUnavailable")
    condition = verdict_of(kube, "tmi-1")
    assert condition is not None and condition["status"] == "True"
    assert "may not be read (HTTP 403; check the Role)" in condition["message"]
    assert instance.controller.policy.revisions == {}
    await eventually(lambda: reason_of(kube, "tmi-1") == "Verified", timeout=10)


async def test_a_refused_watch_of_the_profiles_recovers_once_the_read_is_allowed(
    kube: MemoryKube, owner: Owner, running: Callable[..., Running]
) -> None:
    # How a Role withdrawn under a running controller shows: the open watch ends, and the next
    # watch (not a list) is refused. The next successful list must bring the profile back.
    add_pod(kube, owner)
    instance = running()
    await eventually(lambda: reason_of(kube, "tmi-1") == "Verified")
    lists = kube.calls["list_configmaps"]
    kube.fail_next("watch_configmaps", FORBIDDEN)
    kube.close_watches()
    await eventually(lambda: reason_of(kube, "tmi-1") == "VerifiedRevisionUnavailable")
    await eventually(lambda: reason_of(kube, "tmi-1") == "Verified", timeout=10)
    assert kube.calls["list_configmaps"] == lists + 1
    assert instance.controller.policy.revisions


class RefusingCatalog(MemoryKube):
    """Refuses the first lists of one ConfigMap by name, as a Role that does not name it."""

    def __init__(self, name: str, refusals: int) -> None:
        super().__init__(NAMESPACE)
        self.selector = f"metadata.name={name}"
        self.refusals = refusals

    async def list_page(
        self, collection: Collection, *, limit: int, continue_token: str | None = None
    ) -> Page:
        if collection.field_selector == self.selector and self.refusals:
            self.refusals -= 1
            raise FORBIDDEN
        return await super().list_page(collection, limit=limit, continue_token=continue_token)


async def test_a_recipe_catalog_the_role_may_not_read_is_reported_until_readable(
    owner: Owner,
) -> None:
    rendered = render_catalog(
        {"schemaVersion": 1, "capability": "gpu", "recipes": []}, NAMESPACE, "gpu"
    )
    name = rendered.configmap["metadata"]["name"]
    kube = RefusingCatalog(name, refusals=2)
    kube.put("configmaps", owner.sign(name=PROFILE_NAME))
    kube.put("configmaps", rendered.configmap)
    add_pod(kube, owner)
    settings = controller_settings(owner.settings(gpu_recipe_catalog_configmap=name))
    instance = Running(kube, settings)
    try:
        await eventually(lambda: reason_of(kube, "tmi-1") == "RecipeCatalogUnavailable")
        assert instance.controller.synced
        assert message_of(kube, "tmi-1") == (
            f"the gpu recipe catalog ConfigMap {name} may not be read (HTTP 403; check the "
            "Role), so the plan cannot be checked against the core"
        )
        # Once the catalog may be read, it is applied and the Pod checked against it.
        await eventually(lambda: reason_of(kube, "tmi-1") == "Verified", timeout=10)
        assert kube.refusals == 0
    finally:
        await instance.close()


async def test_restarted_controller_resumes_without_duplicate_transitions(
    kube: MemoryKube, owner: Owner, running: Callable[..., Running]
) -> None:
    for i in range(4):
        add_pod(kube, owner, f"p{i}")
    first = running("ctrl-a")
    await eventually(lambda: all(reason_of(kube, f"p{i}") == "Verified" for i in range(4)))
    await first.close()
    patches, events = len(kube.patches), len(kube.events)
    # While it is down: one Pod is tampered with, one is added.
    kube.mutate("pods", "p0", set_image("registry.invalid/x@sha256:" + "4" * 64))
    add_pod(kube, owner, "p4")
    second = running("ctrl-b")
    await eventually(lambda: reason_of(kube, "p0") == "ImageMismatch")
    await eventually(lambda: reason_of(kube, "p4") == "Verified")
    # Time passes on purpose: a duplicate transition, if any, would be written meanwhile.
    await asyncio.sleep(0.2)
    assert len(kube.patches) == patches + 2
    assert len(kube.events) == events + 2
    assert second.controller.leading


async def test_removing_the_engine_label_withdraws_the_verdict(
    kube: MemoryKube, owner: Owner, running: Callable[..., Running]
) -> None:
    add_pod(kube, owner, "relabelled")
    add_pod(kube, owner, "deleted")
    running()
    await eventually(lambda: reason_of(kube, "relabelled") == "Verified")
    await eventually(lambda: reason_of(kube, "deleted") == "Verified")
    kube.mutate("pods", "relabelled", lambda pod: pod["metadata"].pop("labels"))
    kube.delete("pods", "deleted")
    await eventually(lambda: reason_of(kube, "relabelled") == "EngineLabelRemoved")
    condition = verdict_of(kube, "relabelled")
    assert condition is not None and condition["status"] == "False"
    # Time passes on purpose: a further patch, if any, would be written meanwhile.
    await asyncio.sleep(0.1)
    assert len(kube.patches) == 3
    # Labelled again, it is an engine Pod again and is verified again.
    kube.mutate("pods", "relabelled", lambda pod: pod["metadata"].update({"labels": {ENGINE: "d"}}))
    await eventually(lambda: reason_of(kube, "relabelled") == "Verified")


async def test_failing_patches_back_off_and_recover(
    kube: MemoryKube, owner: Owner, running: Callable[..., Running]
) -> None:
    kube.fail_next("patch_pod_status", ApiError(500, "InternalError", "etcd hiccup"), times=3)
    add_pod(kube, owner)
    instance = running()
    await eventually(lambda: reason_of(kube, "tmi-1") == "Verified")
    assert kube.calls["patch_pod_status"] == 4
    assert instance.controller.queue.failures("tmi-1") == 0


async def test_two_controllers_one_writer_and_takeover(
    kube: MemoryKube, owner: Owner, running: Callable[..., Running]
) -> None:
    a, b = running("ctrl-a"), running("ctrl-b")
    await eventually(lambda: a.controller.leading or b.controller.leading)
    # Time passes on purpose: the other elector keeps trying, and must not lead as well.
    await asyncio.sleep(0.3)
    assert a.controller.leading != b.controller.leading
    leader, follower = (a, b) if a.controller.leading else (b, a)
    for i in range(10):
        add_pod(kube, owner, f"p{i}")
    await eventually(lambda: all(reason_of(kube, f"p{i}") == "Verified" for i in range(10)))
    await eventually(lambda: len(kube.events) == 10)
    writers = {e["reportingInstance"] for e in kube.events}
    assert writers == {leader.controller.settings.leader.identity}
    await leader.close()
    # Released on shutdown: the follower leads without waiting for the Lease to expire.
    await eventually(lambda: follower.controller.leading, timeout=2)
    add_pod(kube, owner, "after")
    await eventually(lambda: reason_of(kube, "after") == "Verified")
    await eventually(lambda: len(kube.events) == 11)
    assert kube.events[-1]["reportingInstance"] == follower.controller.settings.leader.identity
    assert len(kube.patches) == 11


# -- leader election with fake clocks -----------------------------------------------------------


class Ticks:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def elector(kube: MemoryKube, identity: str, ticks: Ticks) -> LeaderElector:
    settings = LeaderSettings(
        name="lease", identity=identity, lease_duration=15, renew_deadline=10, retry_period=2
    )
    return LeaderElector(
        kube,
        settings,
        namespace=NAMESPACE,
        monotonic=ticks,
        wall=lambda: datetime(2026, 11, 29, tzinfo=UTC),
    )


async def test_only_one_elector_leads_and_the_other_takes_over_after_expiry() -> None:
    kube, ticks = MemoryKube(NAMESPACE), Ticks()
    a, b = elector(kube, "a", ticks), elector(kube, "b", ticks)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    assert a.is_leader() and not b.is_leader()
    ticks.t += 2
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    # a stops renewing (crashed or partitioned).
    ticks.t += 10
    assert not a.is_leader()
    assert not await b.try_acquire_or_renew()  # b last saw a change 10s ago
    ticks.t += 5.1
    assert await b.try_acquire_or_renew()
    assert b.is_leader() and not a.is_leader()
    lease = kube.get("leases", "lease")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    # a comes back and cannot take it while b renews.
    assert not await a.try_acquire_or_renew()


async def test_released_lease_is_taken_at_once() -> None:
    kube, ticks = MemoryKube(NAMESPACE), Ticks()
    a, b = elector(kube, "a", ticks), elector(kube, "b", ticks)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    await a.release()
    assert not a.is_leader()
    assert await b.try_acquire_or_renew()


async def test_racing_candidates_one_wins_the_compare_and_swap() -> None:
    kube, ticks = MemoryKube(NAMESPACE), Ticks()
    electors = [elector(kube, f"c{i}", ticks) for i in range(5)]
    results = await asyncio.gather(*(e.try_acquire_or_renew() for e in electors))
    assert sum(results) == 1
    kube.latency = 0.001
    ticks.t += 100
    results = await asyncio.gather(*(e.try_acquire_or_renew() for e in electors))
    assert sum(results) <= 1
    assert sum(e.is_leader() for e in electors) == 1


async def test_never_two_leaders_under_random_schedules() -> None:
    rng = random.Random(7)
    for _ in range(20):
        kube, ticks = MemoryKube(NAMESPACE), Ticks()
        electors = [elector(kube, name, ticks) for name in ("a", "b", "c")]
        alive = {e.identity: True for e in electors}
        for _ in range(300):
            ticks.t += rng.choice([0.1, 0.5, 1, 2, 3, 6])
            for e in electors:
                if rng.random() < 0.05:
                    alive[e.identity] = not alive[e.identity]
                if alive[e.identity] and rng.random() < 0.7:
                    await e.try_acquire_or_renew()
            assert sum(e.is_leader() for e in electors) <= 1


# -- probes and settings -------------------------------------------------------------------------


async def test_health_ready_and_metrics(
    kube: MemoryKube, owner: Owner, running: Callable[..., Running]
) -> None:
    add_pod(kube, owner)
    instance = running()
    client = TestClient(TestServer(create_app(instance.controller)))
    await client.start_server()
    try:
        await eventually(lambda: reason_of(kube, "tmi-1") == "Verified")
        assert (await client.get("/healthz")).status == 200
        ready = await client.get("/readyz")
        assert ready.status == 200 and "leader" in await ready.text()
        text = await (await client.get("/metrics")).text()
        assert 'tmi_allocation_verdicts_total{reason="Verified",status="True"} 1.0' in text
        assert "tmi_allocation_is_leader 1.0" in text
        assert "tmi_allocation_reconcile_duration_seconds_bucket" in text
        assert "tmi_allocation_bind_to_verdict_seconds_count 1.0" in text
        assert 'tmi_allocation_profile_revisions{state="verified"} 1.0' in text
    finally:
        await client.close()
    await instance.close()
    assert instance.controller.metrics.is_leader._value.get() == 0


async def test_readyz_waits_for_the_caches(policy_settings: PolicySettings) -> None:
    kube = MemoryKube(NAMESPACE)
    controller = Controller(kube, controller_settings(policy_settings))
    client = TestClient(TestServer(create_app(controller)))
    await client.start_server()
    try:
        assert (await client.get("/readyz")).status == 503
        assert (await client.get("/healthz")).status == 503
    finally:
        await client.close()


def test_settings_from_flags_and_environment(owner: Owner) -> None:
    env = {
        "POD_NAMESPACE": "kamiwaza",
        "POD_NAME": "tmi-controller-7d9f-abcde",
        "TMI_OWNER_PUBLIC_KEY": owner.public_key,
        "TMI_CLUSTER_BINDING_ID": "demo-cluster",
        "TMI_SCHEDULING_TIMEOUT_SECONDS": "120",
    }
    settings = settings_from_args(["--lease-name", "my-lease", "--workers", "8"], env)
    assert settings.namespace == "kamiwaza"
    assert settings.policy.owner_public_keys == (owner.public_key,)
    assert settings.scheduling_timeout == 120
    assert settings.leader.identity == "tmi-controller-7d9f-abcde"
    assert settings.leader.name == "my-lease"
    assert settings.workers == 8
    assert settings.leader_elect and settings.policy.enabled
    with pytest.raises(ConfigError, match="namespace"):
        settings_from_args([], {k: v for k, v in env.items() if k != "POD_NAMESPACE"})
    with pytest.raises(ConfigError, match="owner-public-key"):
        settings_from_args([], {k: v for k, v in env.items() if k != "TMI_OWNER_PUBLIC_KEY"})
    with pytest.raises(ConfigError, match="api-timeout"):
        settings_from_args(["--api-timeout", "6"], env)
    with pytest.raises(ConfigError, match="renew deadline"):
        settings_from_args(["--renew-deadline", "20"], env)


def test_the_fault_injection_pause_is_off_unless_its_variable_is_set(owner: Owner) -> None:
    env = {
        "POD_NAMESPACE": "kamiwaza",
        "TMI_OWNER_PUBLIC_KEY": owner.public_key,
        "TMI_CLUSTER_BINDING_ID": "demo-cluster",
    }
    assert settings_from_args([], env).fault_pause_before_patch == 0
    paused = settings_from_args([], {**env, FAULT_PAUSE_VARIABLE: "2.5"})
    assert paused.fault_pause_before_patch == 2.5
    # Only the variable turns it on: no flag of that name exists.
    with pytest.raises(SystemExit):
        settings_from_args(["--fault-pause-before-patch-seconds", "1"], env)
    for bad in ("soon", "-1"):
        with pytest.raises(ConfigError, match=FAULT_PAUSE_VARIABLE):
            settings_from_args([], {**env, FAULT_PAUSE_VARIABLE: bad})


# -- the contract with the webhook --------------------------------------------------------------


@pytest.mark.parametrize(
    "document",
    [
        request(),
        request(config__force_cpu=True),
        request("vllm"),
        request("whispercpp", model__format="checkpoint"),
    ],
    ids=["gpu", "cpu", "vllm", "whisper"],
)
async def test_pods_as_the_webhook_plans_them_are_verified(
    owner: Owner, document: dict[str, Any]
) -> None:
    """The Pod the real admission webhook stores, bound, is what the controller verifies."""
    from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME
    from kits.webhookkit import apply_patch, engine_pod, patch_of, published, review
    from webhook.admission import Reviewer, envelope
    from webhook.profile_source import PolicyStore

    settings = owner.settings(gpu_registry_credentials_secret="pull", scheduler_name="tmi")
    store = PolicyStore(settings, clock=lambda: NOW)
    configmap = published(owner.sign())
    store.feed.read(DEFAULT_CONFIGMAP_NAME, configmap)
    pod = engine_pod(document, annotations={"kamiwaza.ai/engine-container": "engine"})
    pod["spec"]["containers"].append({"name": "sidecar", "image": "registry.invalid/s:1"})
    admission = review(pod)
    outcome = Reviewer(store).review(admission["request"], admission["request"]["uid"], NOW)
    assert outcome.allowed, outcome.response
    stored = apply_patch(pod, patch_of(envelope(outcome)))
    stored["metadata"]["creationTimestamp"] = CREATED
    bind(stored, at=CREATED)
    kube = MemoryKube(NAMESPACE)
    kube.put("configmaps", configmap)
    kube.put("pods", stored)
    reconciler = make_reconciler(kube, settings, Clock())
    await reconciler.reconcile(stored["metadata"]["name"])
    condition = verdict_of(kube, stored["metadata"]["name"])
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "Verified"), condition
