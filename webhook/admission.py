"""AdmissionReview in, AdmissionReview out: planning engine Pods and refusing forged ones.

Two kinds of Pod reach this code, through two entries of one MutatingWebhookConfiguration:

* Engine Pods (label `kamiwaza.ai/deployment-id`): the deployment request in their annotation
  is planned by the core, and the Pod is rewritten to the plan (image, resources, RuntimeClass,
  architecture, pull Secret, scheduler, readiness gate, plan annotation) by a JSON Patch
  computed as the difference between the Pod received and the Pod wanted. The plan replaces
  what it governs: the engine container's accelerator asks, the RuntimeClass (removed for a
  CPU plan, whose engine container also loses its limits), the whole nodeSelector and the pull
  Secrets; the container's own cpu and memory asks stay. `spec.nodeName` is refused, since it
  would bypass the scheduler that checks the grant.
* Every other Pod in the namespace (the guard entry): it may not reach for an accelerator on
  its own, as `inference_policy.base.access` defines it; such a Pod is refused with 403 naming each
  field. On UPDATE the plan annotation is frozen, the planned image stays, and no reach may be
  added or changed (`inference_policy.admission.engine_pod`).

The decisions themselves (which rule a Pod meets, what a planned Pod looks like, what counts as
reaching for an accelerator, what an UPDATE may change) live in the core, behind one call
(`inference_policy.admission.pod_review.review_pod`); this module checks the envelope, makes
that call, and writes the answer. Everything here is a function of the review and the store, with no
I/O, so the same code runs under the HTTP server, the tests and the benchmark. Refusals are
denials (HTTP 200, `allowed: false`, the plan's status in `status.code`), which the API server
hands to the client unchanged; only a body that is not an AdmissionReview at all gets a non-200
answer.
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeGuard, cast

import orjson

from inference_policy.admission.engine_admission import EngineSubject
from inference_policy.admission.engine_pod import (
    PlanFields,
    PodRefusal,
    plan_fields,
)
from inference_policy.admission.pod_review import review_pod
from inference_policy.base.access import CONTAINER_LISTS
from inference_policy.base.bounded import keep
from inference_policy.base.codes import RefusalCode
from inference_policy.base.wire import (
    MAX_REQUEST_ANNOTATION_BYTES,
    REQUEST_ANNOTATION,
)
from inference_policy.planning.decision import Decision
from inference_policy.planning.plan import Plan
from webhook.jsonpatch import edits_patch
from webhook.profile_source import Memo, PolicyStore
from webhook.review import API_VERSION, AdmissionRequest, AdmissionResponse, AdmissionReview

_MAX_PLAN_FIELDS = 256

# How the API server's encoder starts every review: TypeMeta inline, then the request's uid.
_GO_PREFIX = b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":'
STATUS_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    409: "Conflict",
    422: "Invalid",
    500: "InternalError",
    503: "ServiceUnavailable",
}


class MalformedReview(ValueError):
    """The body is not an AdmissionReview this server can answer at all (HTTP 400)."""


class MalformedPod(ValueError):
    """The review is answerable but its Pod cannot be read (a 400 denial)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One answered review: the response object plus the labels it is counted under, built once
    and never changed (a cached answer is shared by every review it is replayed for)."""

    response: AdmissionResponse
    outcome: str
    status: int
    reason: str
    plan: Plan | None = None
    warnings: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return bool(self.response.get("allowed"))

    def for_uid(self, uid: str) -> Outcome:
        """The same answer to another review that differs only in its uid."""
        return replace(self, response={**self.response, "uid": uid})


def _allow(uid: str, reason: str, warnings: Sequence[str] = ()) -> Outcome:
    response: AdmissionResponse = {"uid": uid, "allowed": True}
    if warnings:
        response["warnings"] = list(warnings)
    return Outcome(response, "allowed", 200, reason, warnings=tuple(warnings))


def _patched(
    uid: str,
    reason: str,
    ops: list[dict[str, Any]],
    plan: Plan | None = None,
    audit: dict[str, str] | None = None,
) -> Outcome:
    """Allowed, with the patch when there is anything to change."""
    response: AdmissionResponse = {"uid": uid, "allowed": True}
    outcome = "allowed"
    if ops:
        outcome = "patched"
        response["patchType"] = "JSONPatch"
        # binascii directly: base64.b64encode is a Python wrapper around the same call.
        response["patch"] = binascii.b2a_base64(orjson.dumps(ops), newline=False).decode("ascii")
    if audit is not None:
        response["auditAnnotations"] = audit
    return Outcome(response, outcome, 200, reason, plan=plan)


def deny(uid: str, code: int, message: str, reason: RefusalCode) -> Outcome:
    response: AdmissionResponse = {
        "uid": uid,
        "allowed": False,
        "status": {
            "status": "Failure",
            "code": code,
            "reason": STATUS_REASONS.get(code, "Invalid"),
            "message": message,
        },
    }
    return Outcome(response, "refused", code, reason)


def refuse(uid: str, refusal: PodRefusal) -> Outcome:
    return deny(uid, refusal.status, refusal.message, refusal.code)


def envelope(outcome: Outcome, api_version: str = API_VERSION) -> AdmissionReview:
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": outcome.response}


# -- reading the review ------------------------------------------------------------------------


def parse_review(body: bytes, max_bytes: int) -> tuple[AdmissionRequest, str]:
    """The `request` of an AdmissionReview v1 and its uid, or MalformedReview saying why.

    The review is decoded with orjson, which refuses what strict JSON refuses (NaN, Infinity,
    lone surrogates, invalid UTF-8, a byte-order mark, deep nesting) except repeated keys. That
    gap is closed by who writes the review: the API server encodes it from typed objects, so a
    key cannot repeat, and a review posted by anyone else changes nothing but its own answer.
    The text a tenant wrote, the deployment-request annotation, is decoded with the strict
    decoder, as is every /v1/plan body. Strict decoding of the whole review would cost about
    30 microseconds a review, a third of the budget (see bench/bench_webhook.py).
    """
    if len(body) > max_bytes:
        raise MalformedReview(f"AdmissionReview is {len(body)} bytes, more than {max_bytes}")
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedReview(f"AdmissionReview is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise MalformedReview("the body must be a JSON object (an AdmissionReview)")
    if document.get("apiVersion") != API_VERSION or document.get("kind") != "AdmissionReview":
        raise MalformedReview(
            f"expected apiVersion {API_VERSION} and kind AdmissionReview, got "
            f"{document.get('apiVersion')!r} and {document.get('kind')!r}"
        )
    request = document.get("request")
    if not isinstance(request, dict):
        raise MalformedReview("the AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("the AdmissionReview request has no uid")
    # The uid is what AdmissionRequest requires; every other field it types as unchecked.
    return cast(AdmissionRequest, request), uid


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedPod(f"{where} must be an object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedPod(f"{where} must be a list")
    return value


def _check_pod(pod: Any, where: str) -> dict[str, Any]:
    """Check the shape of every field this module reads, so later reads cannot fail.

    The review was decoded by orjson, so every JSON object here is a plain dict: the checks test
    for dict, which costs a tenth of the Mapping ABC's isinstance, and a field's name is spelled
    out only once it is known to be wrong, since every Pod of the namespace passes here."""
    if not isinstance(pod, dict):
        raise MalformedPod(f"{where} is not a Pod object")
    if pod.get("kind", "Pod") != "Pod":
        raise MalformedPod(f"{where} is a {pod.get('kind')!r}, not a Pod")
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict):
        metadata = _mapping(metadata, f"{where}.metadata")
    for key in ("labels", "annotations"):
        values = metadata.get(key)
        if values is None:
            continue
        if not isinstance(values, dict):
            _mapping(values, f"{where}.metadata.{key}")
        for value in values.values():
            if not isinstance(value, str):
                raise MalformedPod(f"{where}.metadata.{key} must map strings to strings")
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise MalformedPod(f"{where}.spec must be an object")
    if not _list(spec.get("containers"), f"{where}.spec.containers"):
        raise MalformedPod(f"{where}.spec.containers must list at least one container")
    for kind in CONTAINER_LISTS:
        containers = spec.get(kind)
        if containers is None:
            continue
        if not isinstance(containers, list):
            _list(containers, f"{where}.spec.{kind}")
        for index, container in enumerate(containers):
            if not isinstance(container, dict) or not isinstance(container.get("name"), str):
                raise MalformedPod(f"{where}.spec.{kind}[{index}] must be an object with a name")
            resources = container.get("resources")
            if resources is not None:
                if not isinstance(resources, dict):
                    _mapping(resources, f"{where}.spec.{kind}[{index}].resources")
                for part in ("requests", "limits"):
                    asks = resources.get(part)
                    if asks is not None and not isinstance(asks, dict):
                        _mapping(asks, f"{where}.spec.{kind}[{index}].resources.{part}")
            env = container.get("env")
            if env is not None:
                if not isinstance(env, list):
                    _list(env, f"{where}.spec.{kind}[{index}].env")
                for entry in env:
                    if not isinstance(entry, dict):
                        raise MalformedPod(
                            f"{where}.spec.{kind}[{index}].env entries must be objects"
                        )
    selector = spec.get("nodeSelector")
    if selector is not None and not isinstance(selector, dict):
        _mapping(selector, f"{where}.spec.nodeSelector")
    for key in ("readinessGates", "imagePullSecrets", "resourceClaims"):
        value = spec.get(key)
        if value is not None and not isinstance(value, list):
            _list(value, f"{where}.spec.{key}")
    return pod


def _is_object(value: Any) -> TypeGuard[Mapping[str, Any]]:
    # dict first: the Mapping ABC's isinstance costs ten times more, and orjson makes dicts.
    return type(value) is dict or isinstance(value, Mapping)


# -- the review --------------------------------------------------------------------------------


class Reviewer:
    """Answers reviews for one namespace against one store."""

    def __init__(self, store: PolicyStore) -> None:
        self.store = store
        self.settings = store.settings
        self.answers: Memo[bytes, Outcome] = Memo(store)
        # The Pod-independent fields of each plan, by plan text and container index: the text
        # names the revision, and the scheduler and Secrets are this install's, so an entry
        # never goes stale; it is bounded because revisions come and go.
        self._fields: dict[tuple[str, int], PlanFields] = {}

    def answer(self, body: bytes, request: AdmissionRequest, uid: str, now: datetime) -> Outcome:
        """The answer to a review body, given its request and uid as `parse_review` read them
        (the edge parses once, and keeps the request for its log line).

        An answer is a function of the decoded review, the store's inputs and the window the
        clock is in, with the uid only echoed. The Pods of one ReplicaSet reach admission as
        identical reviews but for the uid (no name or uid is assigned yet), so a scale-up is
        answered once and then by lookup.

        The key never cuts the uid's text out wherever it occurs: a review posted by anyone
        could carry that text inside its Pod and so share a key with a different Pod, and have
        its answer served for that one. The API server writes the uid first, right after the
        envelope's kind and apiVersion; when the body starts exactly so, the rest of it is the
        key. Any other body (a test's, a replay's) is answered afresh and not remembered:
        re-encoding it to make a key would fail on values the decoder accepts but the encoder
        refuses (nesting past 254 levels), and nobody but the API server sends reviews often.
        """
        prefix = _GO_PREFIX + orjson.dumps(uid)
        if not body.startswith(prefix):
            return self.held_to_quota(self.review(request, uid, now))
        key = body[len(prefix) :]
        found = self.answers.get(key, now)
        if found is not None:
            return self.held_to_quota(found.for_uid(uid))
        outcome = self.review(request, uid, now)
        self.answers.put(key, outcome, now)
        return self.held_to_quota(outcome)

    def held_to_quota(self, outcome: Outcome) -> Outcome:
        """A planned engine Pod (only a CREATE carries its plan in the outcome) that would take
        the namespace past the owner's quota is refused, 403 `quota-exceeded`, naming the quota,
        the limit and what is held. Judged after the memo: a remembered plan is still right, but
        what the namespace holds moves with every Pod."""
        if outcome.plan is None or not outcome.allowed:
            return outcome
        refusal = self.store.quota_refusal(outcome.plan)
        if refusal is None:
            return outcome
        uid = str(outcome.response.get("uid", ""))
        return deny(uid, 403, refusal.message(), RefusalCode.QUOTA_EXCEEDED)

    def review(self, request: AdmissionRequest, uid: str, now: datetime) -> Outcome:
        try:
            return self._review(request, uid, now)
        except MalformedPod as exc:
            return deny(
                uid,
                400,
                f"the Pod in this review cannot be read: {exc}",
                RefusalCode.MALFORMED_POD,
            )

    def _review(self, request: AdmissionRequest, uid: str, now: datetime) -> Outcome:
        kind = request.get("kind")
        resource = request.get("resource")
        if not (
            _is_object(kind)
            and kind.get("group", "") == ""
            and kind.get("kind") == "Pod"
            and _is_object(resource)
            and resource.get("group", "") == ""
            and resource.get("resource") == "pods"
        ):
            return deny(
                uid,
                400,
                f"this webhook reviews core/v1 Pods; got {kind!r} on {resource!r}",
                RefusalCode.MALFORMED_REVIEW,
            )
        operation = request.get("operation")
        if operation not in ("CREATE", "UPDATE"):
            return _allow(uid, "not-checked")
        namespace = request.get("namespace")
        if namespace != self.settings.namespace:
            # Opting a namespace in is the owner's namespaceSelector; this server only holds a
            # profile for its own namespace, so elsewhere it neither plans nor guards.
            return _allow(
                uid,
                "namespace-not-served",
                [
                    f"tenant-mode inference webhook serves namespace {self.settings.namespace}; "
                    f"Pods in {namespace} are not planned or checked"
                ],
            )
        pod = _check_pod(request.get("object"), "object")
        old = _check_pod(request.get("oldObject"), "oldObject") if operation == "UPDATE" else None
        verdict = review_pod(
            operation, pod, old, self.settings.scheduler_name, _Planning(self, now)
        )
        if isinstance(verdict, PodRefusal):
            return refuse(uid, verdict)
        ops = edits_patch(pod, verdict.edits)
        plan = verdict.plan
        if plan is None:
            return _patched(uid, verdict.reason, ops)
        return _patched(
            uid,
            verdict.reason if ops else "unchanged",
            ops,
            plan=plan,
            audit={"plan-path": plan.path, "plan-binding": plan.bindingId or ""},
        )

    def plan_fields(self, index: int, plan: Plan) -> PlanFields:
        """The fields the plan sets, with this install's scheduler and pull Secret, kept for
        the next Pod of the same plan (keyed by its text, which the plan keeps once made)."""
        plan_json = plan.text()
        key = (plan_json, index)
        fields = self._fields.get(key)
        if fields is None:
            secret = (
                self.settings.gpu_registry_credentials_secret
                if plan.path == "gpu"
                else self.settings.cpu_registry_credentials_secret
            )
            fields = plan_fields(
                index,
                plan,
                plan_json,
                scheduler_name=self.settings.scheduler_name,
                pull_secret=secret or None,
            )
            keep(self._fields, key, fields, _MAX_PLAN_FIELDS)
        return fields


class _Planning:
    """One review's planning, as the core's `EnginePlanning`: the store's remembered decision on
    the request text, and the reviewer's remembered plan fields keyed by the plan's text."""

    def __init__(self, reviewer: Reviewer, now: datetime) -> None:
        self.reviewer = reviewer
        self.now = now

    def decide(self, subject: EngineSubject) -> Decision | str:
        planned = self.reviewer.store.plan_text(
            subject.request,
            f"annotation {REQUEST_ANNOTATION}",
            self.now,
            MAX_REQUEST_ANNOTATION_BYTES,
        )
        if planned.error is not None:
            return planned.error
        assert planned.decision is not None
        return planned.decision

    def fields(self, subject: EngineSubject, plan: Plan) -> PlanFields:
        return self.reviewer.plan_fields(subject.index, plan)
