"""The HTTP side of the extender: kube-scheduler's extender protocol, health and metrics.

The app is built by a factory from settings and a cluster source, so tests run it through
aiohttp's test client with a source that feeds it from dicts, and the process runs the very
same app behind TLS with a `KubernetesSource`. Handlers only translate; the decisions are in
`extender.view` and the placement rules in `inference_policy.placing.placement`.

Status codes, on purpose. kube-scheduler treats any status other than 200 as a failed call, and
a filter answer whose `Error` is set as a failed scheduling cycle. So: a body that is not JSON or
not an ExtenderArgs gets 400 with a JSON `Error` naming the problem; a Pod whose plan is bad is a
normal 200 answer with every node in `FailedAndUnresolvableNodes`; `Error` in a 200 is for the
extender's own trouble (caches not synced, a bug, an answer it cannot encode), so the scheduler
retries the Pod and records the message. No handler lets an exception become aiohttp's bare 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from extender.args import ArgsError, extender_args
from extender.config import DEFAULT_MAX_BODY_BYTES
from extender.metrics import ExtenderMetrics
from extender.owner_rights import DEFAULT_INTERVAL, RightsBoard
from extender.quota import QuotaBoard
from extender.sources import ClusterSource
from extender.tenants import Tenant
from extender.verbs import filter_nodes, prioritize_nodes, unencodable
from extender.view import ClusterView, FilterOutcome, Outcome
from extender.wire import ExtenderFilterResult
from inference_policy.base.pod_view import PodView
from policy_io.state import PolicySettings
from serving.app import READ_TIMEOUT, read_limited, running
from serving.probes import add_probes, json_response
from serving.settings import ConnectionLimits
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
    # Each tenant's quota (`extender.quota`); None: no quota is held to.
    quota: QuotaBoard | None = None


RUNTIME = web.AppKey("runtime", Runtime)


def _filter_error(message: str) -> ExtenderFilterResult:
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
        runtime.metrics.requests.inc((verb, "bad-request"))
        raise
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        runtime.metrics.requests.inc((verb, "bad-request"))
        raise web.HTTPBadRequest(
            text=orjson.dumps({"Error": f"the body is not JSON: {exc}"}).decode(),
            content_type="application/json",
        ) from None


def _bad_args(runtime: Runtime, verb: str, exc: ArgsError) -> web.Response:
    runtime.metrics.requests.inc((verb, "bad-request"))
    return json_response({"Error": f"malformed ExtenderArgs: {exc}"}, 400)


def _pod_fields(args: Any) -> dict[str, Any]:
    """The Pod an ExtenderArgs is about, as log fields (whatever of it can be read)."""
    pod = PodView(args.get("Pod") if isinstance(args, dict) else None)
    return {"namespace": pod.namespace, "pod": pod.name or pod.generate_name, "uid": pod.uid}


def _encoded(body: Any) -> web.Response | Exception:
    """The answer as JSON, or why it cannot be encoded (orjson refuses deep nesting, and a
    full-node filter answer echoes Node objects the extender did not write)."""
    try:
        return json_response(body)
    except orjson.JSONEncodeError as exc:
        return exc


INTERNAL_ERROR = "tmi extender internal error (see the extender's log)"


async def filter_handler(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    started = time.perf_counter()
    args = await _args(request, runtime, "filter")
    failure: Exception | None = None
    try:
        outcome = filter_nodes(runtime.view, extender_args(args), runtime.quota)
    except ArgsError as exc:
        return _bad_args(runtime, "filter", exc)
    except Exception as exc:
        failure = exc
        outcome = Outcome(_filter_error(INTERNAL_ERROR), "error")
    if outcome.nodes is not None:
        runtime.metrics.filtered(outcome.nodes)
    response = _encoded(outcome.body)
    if isinstance(response, Exception):
        # A well-formed call the extender cannot answer: the scheduler reads `Error` from a 200
        # (it reads no body from any other status) and retries the Pod.
        outcome = Outcome(_filter_error(unencodable(outcome.body, response)), "unencodable")
        response = json_response(outcome.body)
    runtime.metrics.call("filter", outcome.outcome, time.perf_counter() - started)
    for code, count in outcome.codes.items():
        runtime.metrics.verdict(code, count)
    # Written once the answer is on its way: the scheduler waits for it within its cycle, one
    # Pod at a time, and the line takes as long to format and write as placing the Pod does.
    asyncio.get_running_loop().call_soon(_log_filter, args, outcome, failure)
    return response


def _log_filter(args: Any, outcome: FilterOutcome, failure: Exception | None) -> None:
    """A summary line per call at INFO (an error at WARNING, a bug at ERROR with the
    traceback), and at DEBUG a line per node the placement rules refused."""
    body = outcome.body
    if failure is not None:
        level = logging.ERROR
    elif body.get("Error"):
        level = logging.WARNING
    else:
        level = logging.INFO
    if not log.isEnabledFor(level):
        return
    pod = _pod_fields(args)
    nodes = body.get("Nodes")
    kept = nodes.get("items") if isinstance(nodes, dict) else body.get("NodeNames")
    failed = len(body.get("FailedNodes") or ()) + len(body.get("FailedAndUnresolvableNodes") or ())
    fields: dict[str, Any] = {
        **pod,
        "verb": "filter",
        "outcome": outcome.outcome,
        "nodes": _node_count(args),
        "passed": len(kept or ()),
        "failed": failed,
        "codes": {code: n for code, n in outcome.codes.items() if code != "fits"},
    }
    if body.get("Error"):
        fields["error"] = body["Error"]
    log.log(level, "filter answered", exc_info=failure, extra=fields)
    if outcome.node_codes and log.isEnabledFor(logging.DEBUG):
        reasons = {**body.get("FailedNodes", {}), **body.get("FailedAndUnresolvableNodes", {})}
        for node, code in outcome.node_codes.items():
            log.debug(
                "node refused",
                extra={**pod, "node": node, "code": code, "detail": reasons.get(node)},
            )


def _node_count(args: Any) -> int | None:
    if not isinstance(args, dict):
        return None
    names = args.get("NodeNames")
    if isinstance(names, list):
        return len(names)
    nodes = args.get("Nodes")
    items = nodes.get("items") if isinstance(nodes, dict) else None
    return len(items) if isinstance(items, list) else None


async def prioritize_handler(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    started = time.perf_counter()
    args = await _args(request, runtime, "prioritize")
    try:
        outcome = prioritize_nodes(runtime.view, extender_args(args))
        response = _encoded(outcome.body)
        if isinstance(response, Exception):
            raise response
    except ArgsError as exc:
        return _bad_args(runtime, "prioritize", exc)
    except Exception as exc:
        # The scheduler ignores a failed prioritize call and scores on its own plugins alone;
        # answering 200 with `Error` keeps the cause in the answer instead of aiohttp's bare 500.
        log.exception(
            "prioritize failed",
            extra={**_pod_fields(args), "verb": "prioritize", "nodes": _node_count(args)},
        )
        runtime.metrics.call("prioritize", "error", time.perf_counter() - started)
        message = str(exc) if isinstance(exc, orjson.JSONEncodeError) else INTERNAL_ERROR
        return json_response({"Error": message})
    runtime.metrics.call("prioritize", outcome.outcome, time.perf_counter() - started)
    # The filter's line already records the decision; scores are detail, at DEBUG, so a large
    # cluster's prioritize calls do not pay for finding the best node to log it.
    if log.isEnabledFor(logging.DEBUG):
        scores: list[Any] = outcome.body
        best = max(scores, key=lambda entry: entry["Score"], default=None)
        log.debug(
            "prioritize answered",
            extra={
                **_pod_fields(args),
                "verb": "prioritize",
                "outcome": outcome.outcome,
                "nodes": len(scores),
                "best": best["Host"] if best and best["Score"] > 0 else None,
            },
        )
    return response


def _unready(app: web.Application) -> str | None:
    runtime = app[RUNTIME]
    if runtime.draining:
        return "shutting down"
    view = runtime.view
    quota = runtime.quota.pending if runtime.quota is not None else set()
    if not view.ready or quota:
        return "not read yet: " + ", ".join(sorted(view.pending | quota))
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
    source: ClusterSource,
    *,
    pod_namespaces: Iterable[str] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    reloader: CertificateReloader | None = None,
    cert_reload_seconds: float = 10.0,
    clock: Callable[[], datetime] | None = None,
    read_timeout: float = ConnectionLimits().read_timeout,
    rollback_record: str | None = None,
    tenants: Sequence[Tenant] = (),
    allocation_controller: str | None = None,
    rights_seconds: float = DEFAULT_INTERVAL,
    quota: QuotaBoard | None = None,
) -> web.Application:
    """The extender application, its view kept current by `source` while it runs. `tenants`
    (`extender.tenants`) are every tenant namespace, the first `settings`'; none: that one.
    With `allocation_controller` (its user name), engine Pods are placed only in the namespaces
    where its rights are confirmed, asked every `rights_seconds` (`extender.owner_rights`).
    With `quota` (the board `source` feeds), each Pod is held to its tenant's quota."""
    clock = clock or (lambda: datetime.now(UTC))
    namespaces = [t.namespace for t in tenants] or [settings.namespace]
    scopes = tuple(pod_namespaces) if pod_namespaces is not None else tuple(namespaces)
    rights = (
        RightsBoard(allocation_controller, namespaces, interval=rights_seconds)
        if allocation_controller
        else None
    )
    view = ClusterView(settings, scopes, clock, rollback_record, tenants, rights)
    runtime = Runtime(
        view=view,
        source=source,
        metrics=ExtenderMetrics(view),
        max_body_bytes=max_body_bytes,
        reloader=reloader,
        cert_reload_seconds=cert_reload_seconds,
        quota=quota,
    )
    app = web.Application(client_max_size=max_body_bytes)
    app[RUNTIME] = runtime
    app[READ_TIMEOUT] = read_timeout
    app.router.add_post("/filter", filter_handler)
    app.router.add_post("/prioritize", prioritize_handler)
    add_probes(app, unready=_unready, registry=lambda app: app[RUNTIME].metrics.registry)
    app.cleanup_ctx.append(_lifecycle)
    return app
