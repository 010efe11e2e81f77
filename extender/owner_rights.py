"""Whether the allocation controller may still do its work in each tenant namespace, as the
extender places by it: asked of the API server off the request path, read on it.

`inference_policy.granting.owner_rights` says why a namespace where the controller lost its rights
gets no new engine Pod, and which rights count. Here `RightsReviewer` asks, every `interval`
seconds, one SubjectAccessReview per right and tenant namespace (the extender's ClusterRole grants
the create, cluster-scoped, out of any tenant's reach), and `RightsBoard` keeps the last verdict of
each namespace with the moment it was confirmed. The filter reads the board and makes no call.
A Pod holding a plan that places it is placed only while its namespace's rights are confirmed
by an answer younger than `ttl` (three rounds):

* an answer denying a right makes it `Unplaceable` on every node, naming the rights and the
  RoleBinding to restore (node verdict `owner-rights`): the scheduler parks it until the next
  cluster event;
* no answer to rely on (none yet, the reviews failing for longer than `ttl`, or refused to the
  extender itself, whose ClusterRole then lacks the review) is `Unconfirmed`, the extender's own
  trouble: the filter answers an `Error` and the scheduler retries the Pod after its backoff,
  so an outage of the reviews fails closed for engine Pods only and heals without a nudge.

Until the first round has answered, the namespace is pending (`extender.view` is not ready).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from extender.rollback_record import Requests
from inference_policy.base.codes import NodeVerdictCode
from inference_policy.granting.owner_rights import (
    CONTROLLER_RIGHTS,
    Right,
    RightsVerdict,
    describe,
    judge,
    placement_refusal,
    review_allowed,
    review_interval,
    subject_access_review,
)
from inference_policy.granting.pod_demand import Unplaceable
from serving.kube import describe_error, not_permitted
from serving.periodic import Periodic

log = logging.getLogger(__name__)
REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
DEFAULT_INTERVAL = 5.0
# An answer is trusted for this many intervals: one failed round does not refuse Pods.
TRUSTED_ROUNDS = 3


class Unconfirmed(Exception):
    """No answer on the controller's rights can be relied on now (none yet, none recent, or the
    extender may not ask): the extender's own trouble, answered as the filter's `Error`, so the
    scheduler retries the Pod after its backoff instead of parking it as unschedulable."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _Known:
    verdict: RightsVerdict
    # When the verdict was last confirmed by an answered round (monotonic seconds).
    at: float


class RightsBoard:
    """The last verdict on the controller's rights in each tenant namespace."""

    def __init__(
        self,
        identity: str,
        namespaces: Iterable[str],
        *,
        interval: float = DEFAULT_INTERVAL,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.identity = identity
        self.namespaces = tuple(namespaces)
        # How often a round asks (no more often than the review rate allows), and how long its
        # answers are trusted.
        self.interval = review_interval(interval, len(self.namespaces))
        self.ttl = self.interval * TRUSTED_ROUNDS
        self.monotonic = monotonic
        self._known: dict[str, _Known] = {}
        # The refusal each namespace's Pods get now, made once per change of verdict.
        self._refusals: dict[str, str] = {}

    @property
    def pending(self) -> set[str]:
        """The namespaces no round has answered for yet."""
        return {namespace for namespace in self.namespaces if namespace not in self._known}

    def verdict(self, namespace: str) -> RightsVerdict | None:
        """The namespace's verdict as the filter takes it now: unknown once too old."""
        known = self._known.get(namespace)
        if known is None:
            return None
        if self.monotonic() - known.at > self.ttl:
            why = f"no review has answered for {self.monotonic() - known.at:.0f}s"
            return judge(namespace, {}, CONTROLLER_RIGHTS, why)
        return known.verdict

    def record(self, verdict: RightsVerdict) -> RightsVerdict | None:
        """A round's verdict for its namespace; returns the one it replaces."""
        before = self._known.get(verdict.namespace)
        self._known[verdict.namespace] = _Known(verdict, self.monotonic())
        if verdict.present:
            self._refusals.pop(verdict.namespace, None)
        elif before is None or before.verdict != verdict:
            self._refusals[verdict.namespace] = placement_refusal(verdict, self.identity)
        return None if before is None else before.verdict

    def check(self, namespace: str) -> None:
        """Nothing when the controller's rights in `namespace` are confirmed and fresh;
        Unplaceable when a fresh answer denies one; Unconfirmed when none can be relied on. The
        request path: no call."""
        known = self._known.get(namespace)
        if known is not None and self.monotonic() - known.at <= self.ttl:
            if known.verdict.present:
                return
            if known.verdict.missing:
                raise Unplaceable(self._refusals[namespace], NodeVerdictCode.OWNER_RIGHTS)
        verdict = self.verdict(namespace) or judge(
            namespace, {}, CONTROLLER_RIGHTS, "no review has answered yet"
        )
        raise Unconfirmed(placement_refusal(verdict, self.identity))

    def series(self) -> Iterator[tuple[str, bool, dict[Right, bool]]]:
        """For the metrics, each namespace: whether its rights are confirmed now, and each
        right with a known answer, True when it is missing."""
        for namespace in self.namespaces:
            verdict = self.verdict(namespace)
            if verdict is None:
                yield namespace, False, {}
                continue
            known = {
                right: right in verdict.missing
                for right in CONTROLLER_RIGHTS
                if right not in verdict.unknown
            }
            yield namespace, verdict.present, known


class RightsReviewer:
    """Asks the API server, every `board.interval` seconds, what the board holds."""

    def __init__(self, board: RightsBoard, api: Requests) -> None:
        self.board = board
        self.api = api
        self.rounds = 0
        self.failures = 0
        # One bad round must not end the reviews; the answers age out meanwhile.
        self._loop = Periodic(
            self.review,
            lambda: self.board.interval,
            log,
            "reviewing the controller's rights failed",
            "error",
        )

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def review(self) -> None:
        """One round: every right in every tenant namespace, asked together."""
        self.rounds += 1
        await asyncio.gather(*(self._namespace(ns) for ns in self.board.namespaces))

    async def _namespace(self, namespace: str) -> None:
        rights = CONTROLLER_RIGHTS
        answers = await asyncio.gather(
            *(self._ask(right, namespace) for right in rights), return_exceptions=True
        )
        found: dict[Right, bool | None] = {}
        why = ""
        refused = False
        for right, answer in zip(rights, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                if not_permitted(answer) is None:
                    # The API server did not answer: the last verdict ages until one does.
                    self.failures += 1
                    log.warning(
                        "could not review the controller's rights in namespace %s: %s",
                        namespace,
                        describe_error(answer),
                        extra={"code": "owner-rights-review-failed", "namespace": namespace},
                    )
                    return
                refused = True
                why = (
                    f"the extender may not create SubjectAccessReviews "
                    f"({describe_error(answer)}; check ClusterRole kamiwaza-tmi-extender)"
                )
                found[right] = None
            else:
                found[right] = answer
        verdict = judge(namespace, found, rights, why if refused else "")
        self._recorded(verdict, self.board.record(verdict))

    async def _ask(self, right: Right, namespace: str) -> bool | None:
        review = subject_access_review(self.board.identity, right, namespace)
        return review_allowed(await self.api.request("POST", REVIEWS, body=review))

    def _recorded(self, verdict: RightsVerdict, before: RightsVerdict | None) -> None:
        if before == verdict or (before is None and verdict.present):
            return
        fields = {
            "namespace": verdict.namespace,
            "identity": self.board.identity,
            "missing": [str(right) for right in verdict.missing],
            "unconfirmed": [str(right) for right in verdict.unknown],
        }
        if verdict.present:
            log.info(
                "allocation controller rights confirmed again; engine Pods are placed",
                extra={**fields, "code": "owner-rights-restored"},
            )
            return
        log.warning(
            "allocation controller rights missing; no engine Pod is placed in the namespace",
            extra={
                **fields,
                "code": NodeVerdictCode.OWNER_RIGHTS.value,
                "detail": describe(verdict, self.board.identity),
            },
        )


__all__ = [
    "DEFAULT_INTERVAL",
    "TRUSTED_ROUNDS",
    "RightsBoard",
    "RightsReviewer",
    "Unconfirmed",
]
