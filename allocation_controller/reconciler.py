"""One reconcile: read a Pod, decide its AllocationVerified verdict, write it only if it changed.

The shape is controller-runtime's: `reconcile(name)` is level-based (it looks at the Pod as it is,
never at the event that woke it), idempotent, and returns when to look again. Everything it
knows comes from the Pod itself and the verified profile revisions, so a new process, or a new
leader, reaches the same verdicts and writes nothing the Pod already says.

Writes are narrow on purpose:

* the condition goes out as a strategic merge patch on pods/status, which merges conditions by
  `type`, so the kubelet's and the scheduler's conditions are never touched;
* the patch carries the Pod's resourceVersion as a precondition, so a verdict computed from one
  version of the Pod cannot land on a newer one (a 409 re-reads the Pod and decides again);
* nothing is written when status, reason and message already read as decided, and
  `lastTransitionTime` moves only when the status does (apimachinery's SetStatusCondition);
* an Event is recorded when the status or the reason changes, not for a reworded message.

`may_write` is asked right before every write; the leader elector answers it, so a replica that
has lost its Lease stops writing even in the middle of a reconcile.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from allocation_controller.metrics import Metrics
from allocation_controller.ports import JSON, ClaimReader, Conflict, NotFound, PodPort
from allocation_controller.revisions import PolicyView
from inference_policy.base.pod_view import PodView
from inference_policy.granting.dra_allocation import allocation_verdict, claim_name_of, with_devices
from inference_policy.granting.grant import (
    CONDITION_TYPE,
    DEFAULT_SCHEDULING_TIMEOUT,
    Verdict,
    departed_verdict,
    read_plan,
)
from inference_policy.granting.grant_tenants import kept_apart
from inference_policy.placing.tenancy import Shares
from inference_policy.trust.signing import VerifiedProfile

log = logging.getLogger(__name__)

CONTROLLER_NAME = "kamiwaza.ai/allocation-controller"
EVENT_ACTION = "VerifyAllocation"
MAX_REQUEUE = 24 * 3600.0


class NotLeader(Exception):
    """This replica may not write now; the leader will handle the Pod."""


@dataclass(frozen=True)
class ReconcileSettings:
    scheduling_timeout: float = DEFAULT_SCHEDULING_TIMEOUT
    controller_name: str = CONTROLLER_NAME
    instance: str = "allocation-controller"
    pause_before_patch: float = 0.0
    """Test fault injection only (0, the default, is off): hold each verdict this long after
    the leader check and before its patch, so a test can kill the replica in exactly that
    window. See `allocation_controller.config.FAULT_PAUSE_VARIABLE`."""


@dataclass(frozen=True)
class Result:
    """What happened, and when to look at the Pod again even if nothing changes."""

    outcome: str
    requeue_after: float | None = None


def _time_text(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_time_text(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _says(current: Mapping[str, Any] | None, verdict: Verdict) -> bool:
    return current is not None and (
        current.get("status"),
        current.get("reason"),
        current.get("message"),
    ) == (verdict.status, verdict.reason, verdict.message)


def _name_of(pod: PodView) -> str:
    """The name the Pod's status is patched by. Every Pod the API server stores has one; a Pod
    without is refused here rather than patched under another name."""
    name = pod.name
    if name is None:
        raise ValueError("the Pod has no metadata.name to patch it by")
    return name


def _requeue(delay: float | None) -> float | None:
    if delay is None:
        return None
    return min(max(delay, 0.001), MAX_REQUEUE)


class Reconciler:
    def __init__(
        self,
        port: PodPort,
        policy: PolicyView,
        settings: ReconcileSettings | None = None,
        *,
        clock: Callable[[], datetime] | None = None,
        metrics: Metrics | None = None,
        may_write: Callable[[], bool] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        background_events: bool = False,
        claims: ClaimReader | None = None,
        neighbours: Callable[[str], Shares] | None = None,
    ) -> None:
        self.port = port
        # Other tenants' accounted shares on a node (`allocation_controller.neighbours`); None:
        # this tenant's Pods are not held apart from any.
        self.neighbours = neighbours
        # Where a DRA engine Pod's allocation is read; without it such a Pod is held to its
        # plan only.
        self.claims = claims
        self.policy = policy
        self.settings = settings or ReconcileSettings()
        self.clock = clock or (lambda: datetime.now(UTC))
        self.metrics = metrics or Metrics()
        self.may_write = may_write or (lambda: True)
        self.monotonic = monotonic
        self._bound_seen: dict[str, float] = {}
        # Events are posted off the worker when asked: a worker then waits for one API call per
        # verdict (the patch), not two. The semaphore bounds what may be in flight.
        self.background_events = background_events
        self._event_slots = asyncio.Semaphore(64)
        self._event_tasks: set[asyncio.Task[None]] = set()

    # -- what the watch tells us ---------------------------------------------------------------

    def note_bound(self, uid: str) -> None:
        """The watch showed this Pod bound: start the bind-to-verdict clock (once per Pod)."""
        self._bound_seen.setdefault(uid, self.monotonic())

    def forget(self, uid: str) -> None:
        self._bound_seen.pop(uid, None)

    # -- the reconcile -------------------------------------------------------------------------

    async def reconcile(self, name: str) -> Result:
        pod = await self.port.get_pod(name)
        for attempt in range(2):
            view = PodView(pod)
            if pod is None or not view.is_engine_pod:
                return Result("skipped")
            if view.deletion_timestamp or view.phase in ("Succeeded", "Failed"):
                return Result("skipped")
            now = self.clock()
            evaluation = self.policy.evaluate(pod, now, self.settings.scheduling_timeout)
            requeue = _requeue(evaluation.recheck_after)
            verdict = evaluation.verdict
            if verdict is None:
                return Result("waiting", requeue)
            if verdict.verified and self.claims is not None:
                verdict = await self._allocated(pod, verdict)
            if self.neighbours is not None:
                verdict = kept_apart(pod, verdict, self.policy.revisions, self.neighbours)
            current = view.condition(CONDITION_TYPE)
            if _says(current, verdict):
                return Result("unchanged", requeue)
            try:
                updated = await self._write(pod, current, verdict, now)
            except NotFound:
                return Result("skipped")
            except Conflict:
                if attempt:
                    raise
                # The Pod moved on since it was read: decide again on the version stored now.
                pod = await self.port.get_pod(name, fresh=True)
                continue
            await self._record(updated, current, verdict, now)
            return Result("written", requeue)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _allocated(self, pod: JSON, verdict: Verdict) -> Verdict:
        """A verified DRA engine Pod's verdict once its claim's devices are checked."""
        assert self.claims is not None
        plan = read_plan(pod)
        if isinstance(plan, str) or plan.claim is None:
            return verdict
        profile = self.policy.revisions.get(plan.bundle_sha256 or "")
        if not isinstance(profile, VerifiedProfile):  # pragma: no cover - verified above
            return verdict
        name = claim_name_of(pod, plan)
        claim = await self.claims.get_resource_claim(name) if name else None
        node = PodView(pod).node_name
        slices = await self.claims.list_resource_slices(node) if claim and node else []
        wrong = allocation_verdict(plan, profile.envelope, claim, slices)
        if wrong is not None:
            return wrong
        assert claim is not None
        return with_devices(verdict, claim)

    async def reconcile_departed(self, name: str, uid: str) -> Result:
        """A Pod that left the engine-Pod watch. If it still exists (its label was removed rather
        than the Pod deleted) and reads verified, it is marked False: it is no longer re-checked,
        so the condition must not keep vouching for it and its readiness gate closes."""
        pod = await self.port.get_pod(name, fresh=True)
        view = PodView(pod)
        if pod is None or view.uid != uid or view.is_engine_pod:
            return Result("skipped")
        current = view.condition(CONDITION_TYPE)
        if current is None or current.get("status") != "True":
            return Result("skipped")
        verdict = departed_verdict()
        try:
            updated = await self._write(pod, current, verdict, self.clock())
        except NotFound:
            return Result("skipped")
        await self._record(updated, current, verdict, self.clock())
        return Result("written")

    async def _write(
        self,
        pod: JSON,
        current: Mapping[str, Any] | None,
        verdict: Verdict,
        now: datetime,
    ) -> JSON:
        if not self.may_write():
            raise NotLeader
        kept = current.get("lastTransitionTime") if current is not None else None
        moved = current is None or current.get("status") != verdict.status or not kept
        entry = {
            "type": CONDITION_TYPE,
            "status": verdict.status,
            "reason": verdict.reason,
            "message": verdict.message,
            "lastTransitionTime": _time_text(now) if moved else kept,
        }
        patch: JSON = {"status": {"conditions": [entry]}}
        view = PodView(pod)
        name = _name_of(view)
        version = view.resource_version
        if version:
            patch["metadata"] = {"resourceVersion": version}
        if self.settings.pause_before_patch > 0:
            # The window a crash between read and write falls into; the e2e fault tests wait for
            # this line and kill the process while it sleeps.
            log.warning(
                "fault injection: pausing %.1fs before patching Pod %s",
                self.settings.pause_before_patch,
                name,
            )
            await asyncio.sleep(self.settings.pause_before_patch)
        updated = await self.port.patch_pod_status(name, patch)
        self.metrics.verdicts.labels(verdict.status, verdict.reason).inc()
        uid = view.uid or ""
        seen = self._bound_seen.pop(uid, None) if view.node_name else None
        if seen is not None:
            self.metrics.bind_to_verified.observe(self.monotonic() - seen)
        if log.isEnabledFor(logging.INFO):
            plan = read_plan(pod)
            log.info(
                "condition patched",
                extra={
                    "pod": name,
                    "namespace": self.port.namespace,
                    "uid": uid or None,
                    "verdict": verdict.status,
                    "code": verdict.reason,
                    "binding": None if isinstance(plan, str) else plan.bindingId,
                    "detail": verdict.message,
                },
            )
        return updated

    async def _record(
        self,
        pod: JSON,
        current: Mapping[str, Any] | None,
        verdict: Verdict,
        now: datetime,
    ) -> None:
        """An Event for a transition. Best effort: the condition is the record that matters, and
        retrying the reconcile would find the condition written and never emit the Event."""
        if (
            current is not None
            and current.get("status") == verdict.status
            and current.get("reason") == verdict.reason
        ):
            return
        view = PodView(pod)
        name = str(view.name)
        event = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                "name": f"{name}.{uuid.uuid4().hex[:16]}",
                "namespace": self.port.namespace,
            },
            "eventTime": _micro_time_text(now),
            "reportingController": self.settings.controller_name,
            "reportingInstance": self.settings.instance[:128],
            "action": EVENT_ACTION,
            "reason": verdict.reason,
            "note": verdict.message,
            "type": "Normal" if verdict.verified else "Warning",
            "regarding": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": self.port.namespace,
                "name": name,
                "uid": view.uid,
                "resourceVersion": view.resource_version,
            },
        }
        if not self.may_write():
            return
        if not self.background_events:
            await self._post_event(name, event)
            return
        await self._event_slots.acquire()
        task = asyncio.get_running_loop().create_task(self._post_event(name, event))
        self._event_tasks.add(task)
        task.add_done_callback(self._event_done)

    def _event_done(self, task: asyncio.Task[None]) -> None:
        self._event_tasks.discard(task)
        self._event_slots.release()

    async def _post_event(self, name: str, event: JSON) -> None:
        try:
            await self.port.create_event(event)
        except Exception as exc:
            self.metrics.event_failures.inc()
            log.warning("could not record an Event for Pod %s: %s", name, exc)

    async def drain_events(self) -> None:
        """Wait for the Events posted in the background (shutdown, tests)."""
        if self._event_tasks:
            await asyncio.gather(*self._event_tasks, return_exceptions=True)
