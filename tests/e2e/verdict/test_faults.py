"""Faults on the real control plane: what the stack does when its parts fail under it.

The whole stack runs behind the session's API server (``localcluster.install.stack``), and each test
breaks one thing the way production breaks it, then checks the property that must survive and
measures how long the stack took to come back (``localcluster.servers.faults.record_figure`` keeps
the figures in ``.artifacts/faults.json``; RELIABILITY.md quotes the latest):

* a webhook replica SIGKILLed behind the Service address during a burst of creates: every create
  is stored rewritten as the core plans it or refused with a retryable 500, none stored as sent;
* the extender killed: engine Pods stay Pending with the scheduler's reason naming it, and are
  placed once it is back;
* the leading controller replica SIGKILLed after it read a Pod and before it patched it: the
  standby takes over and the condition is written exactly once, by the API server's own record;
* the profile ConfigMap deleted, then replaced by one signed with an untrusted key: running Pods
  stay verified (with the sticky reason), new engine Pods get the seed's 503;
* etcd and kube-apiserver crashed and restarted under the running servers: they reconnect on
  their own, and no engine Pod, created before or after, is left without a verdict.

Each test restores what it broke. The restart test comes last in the module because it disturbs
the whole session's plane; it returns with the API server ready and every server reconnected, so
the modules that run after this one find the plane as it was.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest

from allocation_controller.config import FAULT_PAUSE_VARIABLE
from allocation_controller.reconciler import CONTROLLER_NAME
from inference_policy.planning.plan import PlanChoice
from inference_policy.planning.planner import PROFILE_PREFIX
from inference_policy.planning.room import replaying
from inference_policy.trust.signing import REFUSAL_PREFIX, Reason
from kits.profilekit import Owner
from kits.stackkit import (
    LARGE,
    h100_stack,
    whole_h100_envelope,
)
from localcluster import ApiError, ControlPlane, FakeNode, Kube, create_fake_nodes, wait_until
from localcluster.install.stack import (
    CONDITION,
    TenantStack,
    condition,
    engine_pod,
    metric,
    parse_metrics,
)
from localcluster.nodes.kwok import delete_fake_nodes
from localcluster.plane.process import http_get
from localcluster.servers.faults import (
    RoundRobinProxy,
    condition_history,
    record_figure,
    restart_apiserver,
    restart_etcd,
    writes_of,
)
from localcluster.servers.webhook import (
    PLAN_ANNOTATION,
    LocalWebhook,
    delete_profile,
    is_planned,
    publish_profile,
    webhook_configuration,
)
from policy_io.offline import snapshot_of
from policy_io.state import PolicySettings

pytestmark = pytest.mark.e2e

ENGINE_HOOK = "pods.tenant-inference.kamiwaza.ai"
BURST = 40
BURST_WORKERS = 8
# The replica dies once this many creates of the burst have been answered.
KILL_AFTER = 12
HOLD = 3.0
PATIENCE = 90.0
# Past the controller's renew deadline (10 s): the leader loses its Lease while the API server is
# away and must win it back, and every informer has backed off a few times.
APISERVER_DOWN = 12.0


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane) -> Iterator[TenantStack]:
    with h100_stack(control_plane, "tmi-faults", 60) as up:
        yield up


@pytest.fixture
def installer(control_plane: ControlPlane, stack: TenantStack) -> Kube:
    return control_plane.kube("tmi-installer")


@pytest.fixture
def kube(control_plane: ControlPlane) -> Kube:
    return control_plane.kube("admin")


@pytest.fixture
def names(control_plane: ControlPlane, stack: TenantStack) -> Iterator[Callable[[str], str]]:
    """Unique Pod names; every Pod named is deleted after the test, in one collection call."""
    run = uuid.uuid4().hex[:6]
    made: list[str] = []

    def make(prefix: str) -> str:
        made.append(f"{prefix}-{run}-{len(made)}")
        return made[-1]

    yield make
    admin = control_plane.kube("admin")
    for name in made:
        with contextlib.suppress(ApiError):
            admin.delete("v1", "Pod", name, stack.settings.namespace, grace_period_seconds=0)


def core_plan(
    stack: TenantStack, body: dict[str, Any], choice: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What the policy core plans for ``body`` under the stack's profile (as ``tmi plan``), with
    the binding `choice` a webhook recorded from the owner's room figures replayed."""
    s = stack.settings
    now = datetime.now(UTC)
    snapshot = snapshot_of(
        PolicySettings(
            enabled=True,
            namespace=s.namespace,
            bundle_configmap=s.bundle_configmap,
            owner_public_keys=s.owner_public_keys,
            cluster_binding_id=s.cluster_binding_id,
            scheduler_name=s.scheduler_name,
        ),
        now,
        profile=stack.profile,
    )
    room = replaying(None if choice is None else PlanChoice.model_validate(choice))
    decision = snapshot.decide(body, now, room)
    assert decision.allowed, decision.body
    plan: dict[str, Any] = decision.body
    return plan


def pod_of(kube: Kube, stack: TenantStack, name: str) -> dict[str, Any]:
    return kube.get("v1", "Pod", name, stack.settings.namespace)


def verdict(
    kube: Kube, stack: TenantStack, name: str, status: str = "True", timeout: float = PATIENCE
) -> dict[str, Any]:
    """The Pod's condition once it reads ``status``."""
    pod = kube.wait_for(
        "v1",
        "Pod",
        name,
        stack.settings.namespace,
        lambda p: (condition(p, CONDITION) or {}).get("status") == status,
        timeout=timeout,
        what=f"Pod {name} AllocationVerified={status}",
    )
    found = condition(pod, CONDITION)
    assert found is not None
    return found


def create(installer: Kube, stack: TenantStack, name: str) -> dict[str, Any]:
    return installer.create(engine_pod(stack.settings.namespace, LARGE, name=name))


def webhook_verifications(plane: ControlPlane, hook: LocalWebhook) -> float:
    context = ssl.create_default_context(cafile=str(plane.ca_file))
    text = http_get(f"{hook.url}/metrics", context)
    return metric(parse_metrics(text), "tmi_webhook_profile_verifications_total")


def log_lines(path: Any, *needles: str) -> list[str]:
    text = path.read_text(errors="replace") if path.exists() else ""
    return [line for line in text.splitlines() if all(n in line for n in needles)]


# -- a webhook replica killed behind the Service address ------------------------------------------


def test_webhook_replica_killed_during_a_burst_admits_nothing_unrewritten(
    control_plane: ControlPlane,
    stack: TenantStack,
    installer: Kube,
    kube: Kube,
    names: Callable[[str], str],
) -> None:
    first = stack.webhook
    assert first is not None
    directory = control_plane.workdir / f"tmi-webhook-b-{uuid.uuid4().hex[:4]}"
    directory.mkdir()
    # The second replica runs as the first does: the chart's settings and ServiceAccount.
    second = LocalWebhook(control_plane, first.settings, directory, identity=first.identity)
    second.start()
    proxy = RoundRobinProxy([first.port, second.port]).start()
    namespace = stack.settings.namespace
    plans: dict[str, dict[str, Any]] = {}

    def rewritten(text: str | None) -> bool:
        """The core's plan for LARGE, for whichever binding choice the webhook recorded."""
        plan = json.loads(text or "null")
        if not isinstance(plan, dict):
            return False
        key = json.dumps(plan.get("choice"), sort_keys=True)
        if key not in plans:
            plans[key] = core_plan(stack, LARGE, plan.get("choice"))
        return plan == plans[key]

    try:
        # Both replicas behind one address, as the Service's endpoints.
        kube.apply(
            webhook_configuration(
                f"{proxy.url}/mutate", control_plane.ca_bundle, namespace=namespace
            )
        )
        wait_until(
            lambda: is_planned(first.probe()) and sum(proxy.connections.values()) > 0,
            timeout=60,
            what="the API server to call the webhook through the proxy",
        )

        answered = threading.Semaphore(0)
        outcomes: dict[str, tuple[str, str]] = {}
        lock = threading.Lock()

        def one(name: str) -> None:
            try:
                stored = installer.create(engine_pod(namespace, LARGE, name=name))
                result = (
                    "stored",
                    stored["metadata"].get("annotations", {}).get(PLAN_ANNOTATION, ""),
                )
            except ApiError as exc:
                result = (f"refused-{exc.status}", exc.message)
            except Exception as exc:  # kept, so the checks below name it rather than lose it
                result = ("error", repr(exc))
            with lock:
                outcomes[name] = result
            answered.release()

        burst = [names("burst") for _ in range(BURST)]
        killed_at = in_rotation = 0
        with ThreadPoolExecutor(BURST_WORKERS) as pool:
            futures = [pool.submit(one, name) for name in burst]
            for _ in range(KILL_AFTER):
                assert answered.acquire(timeout=PATIENCE)
            assert second.process is not None
            second.process.kill()
            with lock:
                killed_at = len(outcomes)
            in_rotation = proxy.connections[second.port]
            for future in futures:
                future.result(timeout=PATIENCE)

        stored = {n: o for n, o in outcomes.items() if o[0] == "stored"}
        refused = {n: o for n, o in outcomes.items() if o[0] != "stored"}
        for name, (_, plan) in stored.items():
            assert rewritten(plan), name
        for name, (kind, message) in refused.items():
            # The API server's answer to a webhook it could not reach (failurePolicy Fail).
            assert kind == "refused-500", (name, kind, message)
            assert f'failed calling webhook "{ENGINE_HOOK}"' in message, message
        # The API server's record agrees: every engine Pod it holds from the burst is rewritten.
        listed = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        held = {p["metadata"]["name"]: p for p in listed if p["metadata"]["name"] in set(burst)}
        assert set(held) == set(stored)
        unrewritten = [
            n
            for n, p in held.items()
            if not rewritten((p["metadata"].get("annotations") or {}).get(PLAN_ANNOTATION))
        ]
        assert unrewritten == []
        assert in_rotation > 0, "the killed replica was never handed a connection"

        # The refusals are retryable: once the endpoint is gone, each retried create is planned.
        proxy.remove(second.port)
        for name in refused:
            again = installer.create(engine_pod(namespace, LARGE, name=name))
            assert rewritten(again["metadata"]["annotations"][PLAN_ANNOTATION])
        record_figure(
            "webhook_replica_killed",
            {
                "creates": BURST,
                "concurrency": BURST_WORKERS,
                "answered_when_killed": killed_at,
                "connections_to_killed_replica": in_rotation,
                "rewritten": len(stored),
                "refused_retryable_500": len(refused),
                "stored_unrewritten": len(unrewritten),
                "retried_and_rewritten": len(refused),
                "connections_refused_by_dead_endpoint": proxy.refused[second.port],
            },
        )
    finally:
        first.install_configuration()
        proxy.stop()
        second.stop_process()


# -- the extender down ----------------------------------------------------------------------------


def test_extender_down_keeps_engine_pods_pending_until_it_is_back(
    stack: TenantStack, installer: Kube, kube: Kube, names: Callable[[str], str]
) -> None:
    extender = stack.extender
    assert extender is not None and extender.process is not None
    extender.process.kill()
    try:
        name = names("no-extender")
        create(installer, stack, name)
        pod = kube.wait_for(
            "v1",
            "Pod",
            name,
            stack.settings.namespace,
            lambda p: (condition(p, "PodScheduled") or {}).get("status") == "False",
            timeout=PATIENCE,
            what=f"the scheduler to report Pod {name} unschedulable",
        )
        scheduled = condition(pod, "PodScheduled")
        assert scheduled is not None
        reason, message = scheduled.get("reason"), scheduled.get("message", "")
        assert reason == "SchedulerError", scheduled
        assert f"{extender.url}/filter" in message, message
        # Bounded negative check: no other path binds it while the extender is away.
        deadline = time.monotonic() + HOLD
        while time.monotonic() < deadline:
            assert not pod["spec"].get("nodeName"), pod["spec"]
            time.sleep(0.5)
            pod = pod_of(kube, stack, name)
        assert not pod["spec"].get("nodeName")
    finally:
        spawned = time.monotonic()
        extender.start()
    back = time.monotonic()
    placed = kube.wait_for(
        "v1",
        "Pod",
        name,
        stack.settings.namespace,
        lambda p: bool(p["spec"].get("nodeName")),
        timeout=PATIENCE,
        what=f"Pod {name} to be placed once the extender is back",
    )
    placed_at = time.monotonic()
    to_placement, from_spawn = placed_at - back, placed_at - spawned
    assert placed["spec"]["schedulerName"] == stack.settings.scheduler_name
    assert verdict(kube, stack, name)["reason"] == "Verified"
    assert metric(extender.metrics(), "tmi_extender_requests_total", verb="filter") >= 1
    record_figure(
        "extender_down",
        {
            "pending_reason": reason,
            "pending_message": message,
            "seconds_from_extender_start_to_placement": round(from_spawn, 2),
            "seconds_from_extender_ready_to_placement": round(to_placement, 2),
        },
    )


# -- the controller killed between its read and its patch -----------------------------------------


def test_controller_killed_between_read_and_patch_writes_the_verdict_once(
    stack: TenantStack, installer: Kube, kube: Kube, names: Callable[[str], str]
) -> None:
    controller = stack.controller
    assert controller is not None
    first = controller.leader_index()
    doomed = 1 - first
    replica = controller.replicas[doomed]
    # The standby comes back with the injection point on, then takes the Lease over.
    controller.stop(doomed)
    replica.env = {FAULT_PAUSE_VARIABLE: "60"}
    try:
        controller.start(doomed)
        controller.stop(first)
        assert controller.wait_leader() == replica.identity
        controller.start(first)

        name = names("torn")
        created = create(installer, stack, name)
        since = created["metadata"]["resourceVersion"]
        log = controller.log_file(replica)
        wait_until(
            lambda: log_lines(log, "before patching Pod", name),
            timeout=PATIENCE,
            what=f"the leader to read Pod {name} and pause before its patch",
        )
        assert replica.process is not None
        replica.process.kill()
        killed = time.monotonic()
        found = verdict(kube, stack, name)
        failover = time.monotonic() - killed
        assert found["reason"] == "Verified"
        assert controller.leader() == controller.replicas[first].identity

        history = condition_history(kube, stack.settings.namespace, name, since, CONDITION)
        writes = writes_of(history)
        assert writes == 1 and history[-1] == found, history
        patched = {
            r.identity: len(log_lines(controller.log_file(r), "condition patched", name))
            for r in controller.replicas
        }
        assert patched == {replica.identity: 0, controller.replicas[first].identity: 1}
        listed = kube.request(
            "GET", f"/apis/events.k8s.io/v1/namespaces/{stack.settings.namespace}/events"
        )["items"]
        events = [
            e
            for e in listed
            if e.get("regarding", {}).get("name") == name
            and e.get("reportingController") == CONTROLLER_NAME
        ]
        assert [e["reason"] for e in events] == ["Verified"]
        record_figure(
            "controller_killed_between_read_and_patch",
            {
                "condition_writes": writes,
                "pod_versions_after_create": len(history),
                "patches_by_replica": patched,
                "seconds_from_kill_to_verdict": round(failover, 2),
                "lease_duration_seconds": stack.settings.lease_duration,
            },
        )
    finally:
        replica.env = {}
        if not replica.running():
            controller.start(doomed)


# -- the profile ConfigMap deleted or replaced while Pods run -------------------------------------


def _refusal(installer: Kube, stack: TenantStack, name: str) -> ApiError | None:
    try:
        installer.create(engine_pod(stack.settings.namespace, LARGE, name=name))
    except ApiError as exc:
        return exc
    return None


def test_profile_deleted_or_untrusted_keeps_running_pods_and_refuses_new_ones(
    control_plane: ControlPlane,
    stack: TenantStack,
    installer: Kube,
    kube: Kube,
    names: Callable[[str], str],
) -> None:
    namespace = stack.settings.namespace
    running = names("running")
    create(installer, stack, running)
    before = verdict(kube, stack, running)
    assert before["reason"] == "Verified"
    denied = (
        f'admission webhook "{ENGINE_HOOK}" denied the request: {PROFILE_PREFIX}{REFUSAL_PREFIX}'
    )
    figure: dict[str, Any] = {}

    def refused_with(reason: Reason, step: str) -> None:
        started = time.monotonic()
        last: list[ApiError | None] = [None]

        def answered() -> bool:
            last[0] = _refusal(installer, stack, names("new"))
            return last[0] is not None and last[0].message == denied + reason.value

        wait_until(answered, timeout=PATIENCE, what=f"new engine Pods to be refused: {reason}")
        exc = last[0]
        assert exc is not None and exc.status == 503, exc
        figure[f"{step}_seconds_to_503"] = round(time.monotonic() - started, 2)
        # The running Pod keeps its verdict: still True, now with the sticky reason.
        pod = kube.wait_for(
            "v1",
            "Pod",
            running,
            namespace,
            lambda p: (
                (condition(p, CONDITION) or {}).get("reason") == "VerifiedRevisionUnavailable"
            ),
            timeout=PATIENCE,
            what=f"Pod {running} to keep its verdict with the sticky reason",
        )
        kept = condition(pod, CONDITION) or {}
        assert kept["status"] == "True"
        assert kept["lastTransitionTime"] == before["lastTransitionTime"]
        figure[f"{step}_running_pod"] = f"{kept['status']} {kept['reason']}"

    try:
        delete_profile(control_plane, namespace, stack.settings.bundle_configmap)
        refused_with(Reason.ARRIVAL, "deleted")
        stranger = Owner()
        publish_profile(
            control_plane,
            stranger.sign(
                whole_h100_envelope(stranger, namespace), name=stack.settings.bundle_configmap
            ),
        )
        refused_with(Reason.KEY, "untrusted")
    finally:
        publish_profile(control_plane, stack.profile)
    assert stack.webhook is not None
    wait_until(
        lambda: is_planned(stack.webhook.probe()),  # type: ignore[union-attr]
        timeout=PATIENCE,
        what="engine Pods to be planned again",
    )
    kube.wait_for(
        "v1",
        "Pod",
        running,
        namespace,
        lambda p: (condition(p, CONDITION) or {}).get("reason") == "Verified",
        timeout=PATIENCE,
        what=f"Pod {running} to be Verified again under the republished profile",
    )
    record_figure("profile_deleted_or_untrusted", figure)


# -- etcd and kube-apiserver restarted under the running servers ----------------------------------


def test_servers_reconnect_after_etcd_and_apiserver_restart(
    control_plane: ControlPlane,
    stack: TenantStack,
    installer: Kube,
    kube: Kube,
    names: Callable[[str], str],
) -> None:
    assert stack.webhook and stack.extender and stack.controller
    servers = {
        "webhook": stack.webhook.process,
        "extender": stack.extender.process,
        **{r.identity: r.process for r in stack.controller.replicas},
    }
    pids = {k: p.pid for k, p in servers.items() if p is not None}
    namespace = stack.settings.namespace
    verified_before = names("before")
    create(installer, stack, verified_before)
    kept = verdict(kube, stack, verified_before)
    in_flight = names("in-flight")
    create(installer, stack, in_flight)

    def lost_leases() -> int:
        assert stack.controller is not None
        return sum(
            len(log_lines(stack.controller.log_file(r), "lost the Lease"))
            for r in stack.controller.replicas
        )

    lost_before = lost_leases()
    etcd_down = restart_etcd(control_plane, kill=True)
    apiserver_down = restart_apiserver(control_plane, kill=True, down=APISERVER_DOWN)
    ready = time.monotonic()

    # The first engine Pod after the restart: rewritten, or refused (then retried), never as sent.
    after = names("after")
    attempts: list[str] = []

    def created() -> bool:
        try:
            pod = create(installer, stack, after)
        except ApiError as exc:
            if exc.status == 409:
                pod = pod_of(kube, stack, after)
            else:
                attempts.append(f"{exc.status} {exc.message[:120]}")
                return False
        assert is_planned(pod), pod["metadata"]
        return True

    wait_until(created, timeout=PATIENCE, what="an engine Pod to be admitted after the restart")
    admitted = time.monotonic() - ready
    stack.controller.wait_leader(timeout=PATIENCE)
    leading = time.monotonic() - ready
    # The outage outlasted the renew deadline: the leader stopped writing, and a replica won the
    # Lease back by itself.
    assert lost_leases() > lost_before

    sched = control_plane.schedulers[stack.settings.scheduler_name]
    # kube-scheduler exits when it cannot renew its Lease in time (by design: its Deployment
    # restarts it, and the new instance waits out the old Lease). The harness plays the kubelet
    # for it; the tmi servers get no such help.
    wait_until(
        lambda: (
            bool(pod_of(kube, stack, after)["spec"].get("nodeName")) or not sched.process.running()
        ),
        timeout=PATIENCE,
        what=f"Pod {after} to be placed (or the scheduler to have exited)",
    )
    scheduler_restarted = not sched.process.running()
    if scheduler_restarted:
        stack.restart_scheduler()

    found = verdict(kube, stack, after)
    recovery = time.monotonic() - ready
    assert found["reason"] == "Verified"
    assert verdict(kube, stack, in_flight)["reason"] == "Verified"
    assert condition(pod_of(kube, stack, verified_before), CONDITION) == kept

    # The extender's node watch is live again: a node created now reaches its cache.
    extra = f"faults-late-{uuid.uuid4().hex[:4]}"
    create_fake_nodes(kube, [FakeNode(extra, gpus=1, vram_gb=80)])
    try:
        stack.extender.wait_nodes([extra], timeout=PATIENCE)
    finally:
        delete_fake_nodes(kube, [extra])
    # The webhook's profile watch is live again: a republished revision is verified afresh.
    hook = stack.webhook
    verified_so_far = webhook_verifications(control_plane, hook)
    publish_profile(control_plane, stack.profile)
    wait_until(
        lambda: (
            webhook_verifications(control_plane, hook) > verified_so_far
            and is_planned(hook.probe())
        ),
        timeout=PATIENCE,
        what="the webhook to verify the republished profile",
    )
    for key, proc in servers.items():
        assert proc is not None and proc.running() and proc.pid == pids[key], key
    record_figure(
        "apiserver_and_etcd_restarted",
        {
            "etcd_kill_to_apiserver_ready_seconds": round(etcd_down, 2),
            "apiserver_down_seconds": APISERVER_DOWN,
            "apiserver_kill_to_ready_seconds": round(apiserver_down, 2),
            "seconds_from_apiserver_ready_to_first_admission": round(admitted, 2),
            "seconds_from_apiserver_ready_to_controller_leading": round(leading, 2),
            "seconds_from_apiserver_ready_to_first_new_verdict": round(recovery, 2),
            "refused_creates_before_admission": len(attempts),
            "scheduler_restarted_by_harness": scheduler_restarted,
            "servers_restarted": 0,
            "namespace": namespace,
        },
    )
