"""The HTTP side of the webhook: routes, body limits, lifecycle, health and metrics.

The app is built by a factory from settings and a ConfigMap source, so tests run it through
aiohttp's test client with a source that feeds it from dicts, and the process entry point runs
the very same app behind TLS with a `KubernetesSource`. Handlers only translate: the admission
logic is in `webhook.admission`, the decision in the core. The handler is also where each
answered review becomes one structured log line, since only the edge sees the review, the answer
and any failure together.

Status codes, on purpose: an AdmissionReview is always answered 200 (a denial is `allowed:
false`), because any other status is a call failure that the API server turns into an opaque 500
for the client; only a body that is not a review at all gets 400, and one over the size limit 413.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from aiohttp import web

from inference_policy.base.codes import RefusalCode
from inference_policy.base.pod_view import PodView
from inference_policy.placing.quota import refusal_body
from policy_io.state import PolicySettings
from serving.app import READ_TIMEOUT, read_limited, running
from serving.probes import add_probes, json_response, problem
from serving.settings import ConnectionLimits
from serving.tls import CertificateReloader
from webhook.admission import MalformedReview, Outcome, Reviewer, deny, envelope, parse_review
from webhook.config import DEFAULT_MAX_BODY_BYTES
from webhook.metrics import WebhookMetrics
from webhook.profile_source import ConfigMapSource, PolicyStore
from webhook.review import AdmissionRequest

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """What the handlers share: the store, its reviewer, metrics and the process's phase."""

    store: PolicyStore
    reviewer: Reviewer
    metrics: WebhookMetrics
    source: ConfigMapSource
    max_body_bytes: int
    clock: Callable[[], datetime]
    reloader: CertificateReloader | None = None
    cert_reload_seconds: float = 10.0
    draining: bool = False

    @cached_property
    def too_large(self) -> dict[str, Any]:
        """The 413 answer's body, made once rather than for every request read."""
        detail = f"request body is larger than the limit of {self.max_body_bytes} bytes"
        return {"status": 413, "detail": detail}


RUNTIME = web.AppKey("runtime", Runtime)


async def _read_body(request: web.Request, runtime: Runtime) -> bytes:
    """The body, or HTTPException with a JSON problem when it is too large."""
    return await read_limited(request, runtime.max_body_bytes, runtime.too_large)


async def mutate(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    metrics = runtime.metrics
    try:
        body = await _read_body(request, runtime)
    except web.HTTPRequestEntityTooLarge:
        metrics.decision("mutate", "error", 413, "too-large")
        log.warning("review not read", extra={"status": 413, "code": "too-large"})
        raise
    started = time.perf_counter()
    try:
        review, uid = parse_review(body, runtime.max_body_bytes)
    except MalformedReview as exc:
        metrics.decision("mutate", "error", 400, "malformed-review")
        fields = {"status": 400, "code": "malformed-review", "detail": str(exc)}
        log.warning("review malformed", extra=fields)
        return problem(400, f"malformed AdmissionReview: {exc}", RefusalCode.MALFORMED_REVIEW)
    failure: Exception | None = None
    try:
        outcome = runtime.reviewer.answer(body, review, uid, runtime.clock())
        response = json_response(envelope(outcome))
    except Exception as exc:
        # Fail closed: a bug must deny the Pod, with a message, rather than break the call.
        failure = exc
        outcome = deny(
            uid,
            500,
            "tenant-mode inference webhook could not check this Pod (internal error; see the "
            "webhook's log)",
            RefusalCode.INTERNAL_ERROR,
        )
        response = json_response(envelope(outcome))
    metrics.observe("mutate", time.perf_counter() - started)
    metrics.decision("mutate", outcome.outcome, outcome.status, outcome.reason)
    _log_review(review, outcome, failure)
    return response


def _log_review(review: AdmissionRequest, outcome: Outcome, failure: Exception | None) -> None:
    """One line per answered review: a refusal at INFO, a failure at ERROR with its traceback,
    an admitted Pod at DEBUG. The fields are gathered from the request the handler parsed, and
    only when the line will be written."""
    if failure is not None:
        level = logging.ERROR
    elif outcome.allowed:
        level = logging.DEBUG
    else:
        level = logging.INFO
    if not log.isEnabledFor(level):
        return
    pod = PodView(review.get("object") or review.get("oldObject"))
    fields: dict[str, Any] = {
        "uid": outcome.response.get("uid"),
        "namespace": review.get("namespace"),
        "pod": pod.name or review.get("name") or pod.generate_name,
        "operation": review.get("operation"),
        "outcome": outcome.outcome,
        "status": outcome.status,
        "code": outcome.reason,
    }
    binding = outcome.plan.bindingId if outcome.plan else None
    if binding is not None:
        fields["binding"] = binding
    status = outcome.response.get("status")
    if isinstance(status, dict) and status.get("message"):
        fields["detail"] = status["message"]
    log.log(level, "review answered", exc_info=failure, extra=fields)


async def plan(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    metrics = runtime.metrics
    try:
        body = await _read_body(request, runtime)
    except web.HTTPRequestEntityTooLarge:
        metrics.decision("plan", "error", 413, "too-large")
        raise
    started = time.perf_counter()
    try:
        planned = runtime.store.plan_text(
            body, "deployment request", runtime.clock(), runtime.max_body_bytes
        )
        decision = planned.decision
        response = None if decision is None else json_response(decision.body, decision.status)
    except Exception:
        # Answered here rather than by aiohttp's bare 500, so the caller gets the API's own
        # problem shape and the log gets the traceback as one JSON line.
        log.exception("plan failed", extra={"status": 500, "code": RefusalCode.INTERNAL_ERROR})
        metrics.decision("plan", "error", 500, RefusalCode.INTERNAL_ERROR)
        return problem(
            500,
            "the plan could not be made (internal error; see the webhook's log)",
            RefusalCode.INTERNAL_ERROR,
        )
    if planned.error is not None:
        metrics.decision("plan", "error", 400, "request-invalid")
        return problem(400, planned.error, RefusalCode.REQUEST_INVALID)
    assert decision is not None and response is not None
    metrics.observe("plan", time.perf_counter() - started)
    refusal = runtime.store.quota_refusal(decision.plan) if decision.plan is not None else None
    if refusal is not None:
        metrics.decision("plan", "refused", 403, RefusalCode.QUOTA_EXCEEDED)
        return json_response(refusal_body(refusal), 403)
    if decision.allowed:
        metrics.decision("plan", "planned", 200, "planned")
    else:
        metrics.decision("plan", "refused", decision.status, str(decision.code))
    return response


def _unready(app: web.Application) -> str | None:
    runtime = app[RUNTIME]
    store = runtime.store
    if runtime.draining:
        return "shutting down"
    if not store.ready:
        missing = sorted(set(store.names) & set(store.feed.pending))
        return "not read yet: " + ", ".join(f"ConfigMap {n}" for n in missing)
    if store.quota is not None and not store.quota.ready:
        return "not read yet: the owner's quota and the namespace's engine Pods"
    # Ready even while the profile is refused: refusing with the seed's 503 reason is this
    # server's job, and taking it out of the Service would turn that into a call failure.
    return None


def _lifecycle(app: web.Application) -> contextlib.AbstractAsyncContextManager[None]:
    runtime = app[RUNTIME]
    return running(
        lambda: runtime.source.start(runtime.store),
        runtime.source.stop,
        runtime.reloader,
        runtime.cert_reload_seconds,
    )


def create_app(
    settings: PolicySettings,
    source: ConfigMapSource,
    *,
    store: PolicyStore | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    reloader: CertificateReloader | None = None,
    cert_reload_seconds: float = 10.0,
    clock: Callable[[], datetime] | None = None,
    read_timeout: float = ConnectionLimits().read_timeout,
) -> web.Application:
    """The webhook application, its store kept current by `source` while it runs."""
    clock = clock or (lambda: datetime.now(UTC))
    store = store or PolicyStore(settings, clock=clock)
    metrics = WebhookMetrics(store)
    if reloader is not None:
        metrics.watch_certificate(reloader)
    reviewer = Reviewer(store)
    metrics.watch_memos({"answers": reviewer.answers, "plans": store.plans})
    runtime = Runtime(
        store=store,
        reviewer=reviewer,
        metrics=metrics,
        source=source,
        max_body_bytes=max_body_bytes,
        clock=clock,
        reloader=reloader,
        cert_reload_seconds=cert_reload_seconds,
    )
    app = web.Application(client_max_size=max_body_bytes)
    app[RUNTIME] = runtime
    app[READ_TIMEOUT] = read_timeout
    app.router.add_post("/mutate", mutate)
    app.router.add_post("/v1/plan", plan)
    add_probes(app, unready=_unready, registry=lambda app: app[RUNTIME].metrics.registry)
    app.cleanup_ctx.append(_lifecycle)
    return app
