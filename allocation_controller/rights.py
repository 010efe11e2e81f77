"""The controller's own rights in its tenant namespace: confirmed, and reported when they are not.

The tenant's namespace admin may delete the RoleBinding (or edit the Role) the owner release
gives this controller in the tenant namespace. The controller then cannot see a Pod change or
write a verdict, and the last verdict stands (`inference_policy.granting.owner_rights` says why and
which rights count). The extender refuses to place engine Pods there meanwhile; this module makes
the controller say so itself, where the owner looks:

* `tmi_allocation_rights_missing{namespace,resource,verb}`: 1 for each right the API server
  says this controller lacks, 0 for each it holds (the `TmiControllerRightsMissing` alert);
* a JSON log line at each change, with the missing rights and the RoleBinding to restore;
* an Event in the owner's namespace regarding this replica's own Pod (or, without `POD_NAME`,
  its Lease), posted with a right the tenant cannot take away: `RightsConfirmed` at the first
  answer, `RightsMissing` when a right goes, `RightsRestored` when all are back.

The answers come from SelfSubjectAccessReviews, which every authenticated identity may create,
asked every `interval` seconds and at once after the API server refuses this controller a Pod
read or a status patch (`wake`), so recovery is noticed without a Pod to retry. The controller
stays ready meanwhile: the loss is the tenant's doing and a restart cannot mend it, while an
unready replica would hold up the owner's rollouts and node drains (its PodDisruptionBudget).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from allocation_controller.metrics import Metrics
from allocation_controller.ports import JSON, AccessPort
from inference_policy.granting.owner_rights import (
    CONTROLLER_RIGHTS,
    Right,
    RightsVerdict,
    describe,
    judge,
    restore_hint,
    review_allowed,
    self_access_review,
)
from serving.kube import ApiError, describe_error

log = logging.getLogger(__name__)

WHO = "the allocation controller"
ACTION = "ReviewRights"
CONFIRMED, MISSING, RESTORED = "RightsConfirmed", "RightsMissing", "RightsRestored"
# After a round, wait at least this long before a wake-up starts the next: a burst of refused
# patches asks once, not once per patch.
MIN_GAP = 1.0
NOTE_LIMIT = 1024


@dataclass(frozen=True, slots=True)
class Reporter:
    """Where the Events go: the owner's namespace, regarding this replica's Pod (or Lease)."""

    namespace: str
    regarding: JSON
    controller: str
    instance: str


def reporter_for(
    namespace: str, pod_name: str | None, lease: str, controller: str, instance: str
) -> Reporter:
    if pod_name:
        regarding = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod_name}
    else:
        regarding = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "namespace": namespace,
            "name": lease,
        }
    return Reporter(namespace, regarding, controller, instance[:128])


class RightsMonitor:
    """Asks whether this controller holds `CONTROLLER_RIGHTS` in `namespace`; reports changes."""

    def __init__(
        self,
        port: AccessPort,
        namespace: str,
        reporter: Reporter,
        metrics: Metrics,
        *,
        interval: float = 15.0,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.port = port
        self.namespace = namespace
        self.reporter = reporter
        self.metrics = metrics
        self.interval = interval
        self.clock = clock or (lambda: datetime.now(UTC))
        self.verdict: RightsVerdict | None = None
        self.rounds = 0
        self.failures = 0
        self._wake = asyncio.Event()

    @property
    def missing(self) -> bool:
        """The last answer says a right is missing or unconfirmed."""
        return self.verdict is not None and not self.verdict.present

    def summary(self) -> str:
        """The last verdict in a sentence (for /readyz)."""
        if self.verdict is None:
            return "rights not reviewed yet"
        return describe(self.verdict, WHO)

    def wake(self) -> None:
        """The API server refused this controller something: ask again now."""
        self._wake.set()

    async def run(self) -> None:
        """Review until cancelled; no error ends it."""
        while True:
            self._wake.clear()
            try:
                await self.review()
            except Exception:
                log.exception("reviewing the controller's rights failed")
            await asyncio.sleep(min(MIN_GAP, self.interval))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, self.interval - MIN_GAP)):
                    await self._wake.wait()

    async def review(self) -> RightsVerdict | None:
        """One round: every right asked together; the verdict, or None if it went unanswered."""
        self.rounds += 1
        rights = CONTROLLER_RIGHTS
        answers = await asyncio.gather(
            *(self._ask(right) for right in rights), return_exceptions=True
        )
        found: dict[Right, bool | None] = {}
        why = ""
        for right, answer in zip(rights, answers, strict=True):
            if answer is None or isinstance(answer, bool):
                found[right] = answer
                continue
            if not isinstance(answer, Exception):
                raise answer
            if isinstance(answer, ApiError) and answer.status == 401:
                # Credentials the API server no longer accepts allow nothing at all.
                found[right], why = False, f"its credentials are refused ({describe_error(answer)})"
            elif isinstance(answer, ApiError) and answer.status == 403:
                found[right] = None
                why = f"it may not review its own rights ({describe_error(answer)})"
            else:
                self.failures += 1
                log.warning(
                    "could not review the controller's rights: %s",
                    describe_error(answer),
                    extra={"namespace": self.namespace, "code": "rights-review-failed"},
                )
                return None
        verdict = judge(self.namespace, found, rights, why)
        change = self._apply(verdict)
        if change is not None:
            await self._post(*change)
        return verdict

    async def _ask(self, right: Right) -> bool | None:
        return review_allowed(
            await self.port.review_access(self_access_review(right, self.namespace))
        )

    def _apply(self, verdict: RightsVerdict) -> tuple[str, str, bool] | None:
        """Take the verdict into the metric; a change is logged and returned as the Event's
        reason, note and whether it is Normal."""
        before, self.verdict = self.verdict, verdict
        for right in CONTROLLER_RIGHTS:
            if right in verdict.unknown:
                continue
            gauge = self.metrics.rights_missing.labels(
                self.namespace, right.resource_path, right.verb
            )
            gauge.set(1 if right in verdict.missing else 0)
        if before == verdict:
            return None
        fields = {
            "namespace": self.namespace,
            "missing": [str(right) for right in verdict.missing],
            "unconfirmed": [str(right) for right in verdict.unknown],
        }
        if verdict.why:
            fields["why"] = verdict.why
        if verdict.present:
            reason = CONFIRMED if before is None else RESTORED
            note = describe(verdict, WHO)
            log.info("rights in the tenant namespace confirmed", extra={**fields, "code": reason})
        else:
            reason = MISSING
            note = (
                f"{describe(verdict, WHO)}: its verdicts there cannot follow the Pods, and the "
                f"extender places no engine Pod there; {restore_hint(self.namespace)}"
            )
            log.warning(
                "rights in the tenant namespace missing; verdicts there cannot be kept",
                extra={**fields, "code": reason, "detail": note},
            )
        return reason, note, verdict.present

    async def _post(self, reason: str, note: str, normal: bool) -> None:
        """The Event, best effort: the metric and the log line are already out."""
        reporter = self.reporter
        now = self.clock().astimezone(UTC)
        event: Mapping[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                "name": f"{reporter.regarding['name']}.{uuid.uuid4().hex[:16]}",
                "namespace": reporter.namespace,
            },
            "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": reporter.controller,
            "reportingInstance": reporter.instance,
            "action": ACTION,
            "reason": reason,
            "note": note[:NOTE_LIMIT],
            "type": "Normal" if normal else "Warning",
            "regarding": reporter.regarding,
        }
        try:
            await self.port.create_owner_event(event)
        except Exception as exc:
            self.metrics.event_failures.inc()
            log.warning(
                "could not record a %s Event: %s",
                reason,
                describe_error(exc),
                extra={"namespace": reporter.namespace},
            )


__all__ = ["CONFIRMED", "MISSING", "RESTORED", "Reporter", "RightsMonitor", "reporter_for"]
