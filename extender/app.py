"""The HTTP side of the extender: kube-scheduler's extender protocol, health and metrics.

The app is built by a factory from settings and a cluster source, so tests run it through
aiohttp's test client with a `MemorySource`, and the process runs the very same app behind TLS
with a `KubernetesSource`. Handlers only translate; the decisions are in `extender.view` and the
placement rules in `inference_policy.placement`.

Status codes, on purpose. kube-scheduler treats any status other than 200 as a failed call, and
a filter answer whose `Error` is set as a failed scheduling cycle. So: a body that is not JSON or
not an ExtenderArgs gets 400 with a JSON `Error` naming the problem (never 500); a Pod whose plan
is bad is a normal 200 answer with every node in `FailedAndUnresolvableNodes`; `Error` is only
for the extender's own trouble (caches not synced, a bug), so the scheduler retries the Pod.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from extender.config import DEFAULT_MAX_BODY_BYTES
from extender.metrics import ExtenderMetrics
from extender.sources import ClusterSource, MemorySource
from extender.view import ArgsError, ClusterView, Outcome, filter_nodes, prioritize_nodes
from policy_io.state import PolicySettings
from serving.app import read_limited, running
from serving.probes import add_probes, json_response
from serving.tls import CertificateReloader

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """What the handlers share."""

    view: ClusterView
    source: ClusterSource
    metrics: ExtenderMetrics
    max_body_bytes: int
    reloader: CertificateReloader | None = None
    cert_reload_seconds: float = 10.0
    draining: bool = False


RUNTIME = web.AppKey("runtime", Runtime)


def _filter_error(message: str) -> dict[str, Any]:
    return {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": message,
    }


async def _args(request: web.Request, runtime: Runtime, verb: str) -> Any:
    """The decoded body, or an HTTPException carrying a JSON `Error`."""
    limit = runtime.max_body_bytes
    try:
        body = await read_limited(
            request, limit, {"Error": f"request body is larger than {limit} bytes"}
        )
    except web.HTTPRequestEntityTooLarge:
        runtime.metrics.requests.labels(verb, "bad-request").inc()
        raise
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        runtime.metrics.requests.labels(verb, "bad-request").inc()
        raise web.HTTPBadRequest(
            text=orjson.dumps({"Error": f"the body is not JSON: {exc}"}).decode(),
            content_type="application/json",
        ) from None


def _bad_args(runtime: Runtime, verb: str, exc: ArgsError) -> web.Response:
    runtime.metrics.requests.labels(verb, "bad-request").inc()
    return json_response({"Error": f"malformed ExtenderArgs: {exc}"}, 400)


def _pod_name(args: Any) -> str:
    pod = args.get("Pod") if isinstance(args, dict) else None
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    if not isinstance(meta, dict):
        return "?"
    return f"{meta.get('namespace')}/{meta.get('name') or meta.get('generateName', '') + '*'}"


async def filter_handler(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    started = time.perf_counter()
    args = await _args(request, runtime, "filter")
    try:
        outcome = filter_nodes(runtime.view, args)
    except ArgsError as exc:
        return _bad_args(runtime, "filter", exc)
    except Exception:
        log.exception("filter for %s failed", _pod_name(args))
        outcome = Outcome(
            _filter_error("tmi extender internal error (see the extender's log)"), "error"
        )
    response = json_response(outcome.body)
    runtime.metrics.call("filter", outcome.outcome, time.perf_counter() - started)
    for code, count in outcome.codes.items():
        runtime.metrics.verdicts.labels(code).inc(count)
    _log_filter(args, outcome)
    return response


def _log_filter(args: Any, outcome: Outcome) -> None:
    body = outcome.body
    passed = body.get("NodeNames") if body.get("Nodes") is None else body["Nodes"]["items"]
    if outcome.outcome == "planned" and passed:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("filter %s: %d nodes pass", _pod_name(args), len(passed))
        return
    if outcome.outcome == "unplanned":
        return
    reasons = {**body.get("FailedNodes", {}), **body.get("FailedAndUnresolvableNodes", {})}
    sample = next(iter(reasons.items()), None)
    log.info(
        "filter %s: %s, no node passes%s%s",
        _pod_name(args),
        outcome.outcome,
        f" ({len(reasons)} refused; e.g. {sample[0]}: {sample[1]})" if sample else "",
        f"; error: {body['Error']}" if body.get("Error") else "",
    )


async def prioritize_handler(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    started = time.perf_counter()
    args = await _args(request, runtime, "prioritize")
    try:
        outcome = prioritize_nodes(runtime.view, args)
    except ArgsError as exc:
        return _bad_args(runtime, "prioritize", exc)
    except Exception:
        # The scheduler ignores a failed prioritize call and scores on its own plugins alone.
        log.exception("prioritize for %s failed", _pod_name(args))
        runtime.metrics.requests.labels("prioritize", "error").inc()
        return json_response({"Error": "tmi extender internal error (see the extender's log)"}, 500)
    response = json_response(outcome.body)
    runtime.metrics.call("prioritize", outcome.outcome, time.perf_counter() - started)
    return response


def _unready(app: web.Application) -> str | None:
    runtime = app[RUNTIME]
    if runtime.draining:
        return "shutting down"
    view = runtime.view
    if not view.ready:
        return "not read yet: " + ", ".join(sorted(view.pending))
    # Ready even while the profile is refused: refusing GPU Pods with the reason is this
    # server's job, and leaving the Service would turn it into a failed call instead.
    return None


def _lifecycle(app: web.Application) -> contextlib.AbstractAsyncContextManager[None]:
    runtime = app[RUNTIME]
    return running(
        lambda: runtime.source.start(runtime.view),
        runtime.source.stop,
        runtime.reloader,
        runtime.cert_reload_seconds,
    )


def create_app(
    settings: PolicySettings,
    source: ClusterSource | None = None,
    *,
    pod_namespaces: Iterable[str] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    reloader: CertificateReloader | None = None,
    cert_reload_seconds: float = 10.0,
    clock: Callable[[], datetime] | None = None,
) -> web.Application:
    """The extender application; `source` defaults to an empty in-memory one."""
    clock = clock or (lambda: datetime.now(UTC))
    scopes = tuple(pod_namespaces) if pod_namespaces is not None else (settings.namespace,)
    view = ClusterView(settings, scopes, clock)
    runtime = Runtime(
        view=view,
        source=source or MemorySource(),
        metrics=ExtenderMetrics(view),
        max_body_bytes=max_body_bytes,
        reloader=reloader,
        cert_reload_seconds=cert_reload_seconds,
    )
    app = web.Application(client_max_size=max_body_bytes)
    app[RUNTIME] = runtime
    app.router.add_post("/filter", filter_handler)
    app.router.add_post("/prioritize", prioritize_handler)
    add_probes(app, unready=_unready, registry=lambda app: app[RUNTIME].metrics.registry)
    app.cleanup_ctx.append(_lifecycle)
    return app
