"""Is a bound engine Pod running exactly the grant its plan names? The AllocationVerified verdict.

The seed makes the `kamiwaza.ai/AllocationVerified` condition, not readiness, the proof that a Pod
got what it asked for. The webhook writes a plan at admission, but a Pod can drift from it
afterwards (annotations are mutable, a sidecar can be injected, a resize can change resources)
and the webhook may not have been the last writer at all, so the verdict is recomputed from the
Pod as stored, against two things:

* the Pod against its own plan annotation: the engine container's image and the plan's resource
  names, the RuntimeClass and the architecture selector; no other container asks for an
  accelerator, and nothing reaches for devices outside the plan;
* the plan against the core: `decide` re-run on the Pod's request annotation under the profile
  revision the plan names (by its bundle sha256) must give the same plan, so a plan annotation
  that no signed revision would have produced is caught.

Time is handled in two separate places on purpose. The re-run is asked *which* plan the revision
gives, not *whether* the revision is still valid, so it is evaluated at a moment inside the
revision's window (the Pod's creation, clamped into the window); a later revision therefore
never disturbs a running Pod. Whether the revision is still valid now is a separate policy:

* a Pod not yet verified whose revision has expired (or cannot be read any more) is reported
  False, because a grant is not vouched for by an expired authorization;
* a Pod already verified True stays True when the only thing that changed is the authorization
  behind it (the revision expired, was removed, or is refused after a key rotation); the reason
  and message change to say so. Flipping it would drop a healthy replica out of its Service
  through the readiness gate, while the seed says a running deployment keeps what it was planned
  with and that the fix for expiry is to publish a new revision and redeploy. Anything that
  changes the Pod itself still flips it to False.

Everything here is a function of its arguments: the controller supplies the Pod, the verified
revision, the planning context and the clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from inference_policy.admission.device_gate import device_gate
from inference_policy.base import strictjson
from inference_policy.base.codes import (
    ENGINE_LABEL_REMOVED,
    IMAGE_MISMATCH,
    NODE_SELECTOR_MISMATCH,
    PLAN_MISMATCH,
    PLAN_MISSING,
    POD_TOO_LARGE,
    PROFILE_EXPIRED,
    PROFILE_REFUSED,
    PROFILE_REVISION_UNKNOWN,
    PROFILES_UNREADABLE,
    RECIPE_CATALOG_UNAVAILABLE,
    RESOURCES_MISMATCH,
    RUNTIME_CLASS_MISMATCH,
    SCHEDULING_TIMEOUT,
    UNPLANNED_DEVICE_ACCESS,
    VERIFIED,
    VERIFIED_PROFILE_EXPIRED,
    VERIFIED_REVISION_UNAVAILABLE,
)
from inference_policy.base.pod_view import PodView
from inference_policy.base.wire import (
    ENGINE_LABEL,
    MAX_REQUEST_ANNOTATION_BYTES,
    REQUEST_ANNOTATION,
)
from inference_policy.granting.grant_findings import pod_findings
from inference_policy.granting.kept_pod import MAX_KEPT_POD_BYTES, too_large
from inference_policy.granting.stored_pod import (
    CONDITION_TYPE,
    created_at,
    plan_revision,
    read_plan,
    verified_before,
)
from inference_policy.planning.plan import Plan
from inference_policy.planning.planner import GpuOptions, PlanContext, decide
from inference_policy.planning.recipe_inputs import unavailable
from inference_policy.planning.room import replaying
from inference_policy.trust.profile import ARCH_KEY, format_timestamp
from inference_policy.trust.signing import ProfileRefused, VerifiedProfile

MAX_MESSAGE = 1024
DEFAULT_SCHEDULING_TIMEOUT = 300.0

Status = Literal["True", "False"]


@dataclass(frozen=True)
class Verdict:
    """What the condition should say: status, a CamelCase reason, and a message for people."""

    status: Status
    reason: str
    message: str

    @property
    def verified(self) -> bool:
        return self.status == "True"


@dataclass(frozen=True)
class Lapse:
    """Why the authority behind a plan cannot be consulted now (the revision is gone, refused,
    or something else the re-derivation needs is unavailable): a reason and a message."""

    reason: str
    message: str


@dataclass(frozen=True)
class Evaluation:
    """A verdict to write, if any, and when the Pod must be looked at again even if unchanged."""

    verdict: Verdict | None
    recheck_after: float | None = None


def _false(reason: str, message: str) -> Verdict:
    return Verdict("False", reason, clip(message))


def clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"


# -- the plan against the core -------------------------------------------------------------------


def _revision_text(profile: VerifiedProfile) -> str:
    return (
        f"profile revision {profile.configmap_name} v{profile.version} "
        f"(bundle sha256 {profile.sha256[:12]})"
    )


def _plan_time(pod: Mapping[str, Any], profile: VerifiedProfile | None, now: datetime) -> datetime:
    """When the plan was made (the Pod's creation), clamped into the revision's window so the
    re-run answers which plan the revision gives rather than whether it is still valid."""
    moment = created_at(pod) or now
    if profile is None:
        return moment
    issued, expires = profile.envelope.issued_at, profile.envelope.expires_at
    latest = expires - timedelta(seconds=1)
    return max(issued, min(moment, latest)) if latest >= issued else moment


def _request(pod: Mapping[str, Any]) -> Any:
    text = PodView(pod).annotation(REQUEST_ANNOTATION)
    if text is None:
        raise ValueError(f"the Pod carries no {REQUEST_ANNOTATION} annotation any more")
    try:
        return strictjson.loads(
            text, max_bytes=MAX_REQUEST_ANNOTATION_BYTES, what=REQUEST_ANNOTATION
        )
    except strictjson.StrictJSONError as exc:
        raise ValueError(f"the {REQUEST_ANNOTATION} annotation cannot be read: {exc}") from None


def _plan_differences(annotated: Mapping[str, Any], derived: Mapping[str, Any]) -> str:
    """The first few top-level fields where the annotation and the core's plan differ."""
    keys = sorted(set(annotated) | set(derived))
    parts = [
        f"{key}: annotation {_compact(annotated.get(key))}, core {_compact(derived.get(key))}"
        for key in keys
        if annotated.get(key) != derived.get(key)
    ]
    shown = "; ".join(parts[:3])
    return shown + (f"; and {len(parts) - 3} more" if len(parts) > 3 else "")


def _compact(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 120 else text[:119] + "…"


def _rederive(
    pod: Mapping[str, Any],
    plan: Plan,
    profile: VerifiedProfile | None,
    ctx: PlanContext,
    now: datetime,
    options: GpuOptions | None = None,
) -> Verdict | None:
    """None when the core gives this exact plan for the Pod's request; else the PlanMismatch.
    `options` is the server's table of GPU options (`planner.decide`), or None."""
    try:
        document = _request(pod)
    except ValueError as exc:
        return _false(PLAN_MISMATCH, f"{exc}; the plan cannot be checked against the core")
    at = _plan_time(pod, profile, now)
    # The figures the webhook chose with are not the check's to see: the recorded choice is
    # replayed, and must give this very plan (`inference_policy.planning.room`).
    context = ctx._replace(
        profile=profile, profile_refusal=None, now=at, room=replaying(plan.choice)
    )
    decision = decide(document, context, options)
    under = _revision_text(profile) if profile is not None else "this install's settings"
    if not decision.allowed:
        return _false(
            PLAN_MISMATCH,
            f"under {under} the core refuses the Pod's deployment request "
            f"({decision.status}: {decision.detail}), yet the Pod carries a plan",
        )
    annotated = plan.wire()
    if decision.body != annotated:
        return _false(
            PLAN_MISMATCH,
            f"the plan annotation is not what {under} plans for the Pod's deployment request: "
            + _plan_differences(annotated, decision.body),
        )
    return None


def _lapse(pod: Mapping[str, Any], lapse: Lapse, sticky_reason: str) -> Verdict:
    if verified_before(pod):
        return Verdict(
            "True",
            sticky_reason,
            clip(
                f"the Pod still matches the plan it was verified against; {lapse.message}. It "
                "stays verified: publish a new profile revision and redeploy to renew the grant"
            ),
        )
    return _false(lapse.reason, lapse.message)


def _grant_summary(pod: Mapping[str, Any], plan: Plan) -> str:
    shown = plan.limits or plan.requests
    granted = ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or "no resources"
    if plan.claim is not None:
        granted = f"{plan.claim.count} device(s) claimed from template {plan.claim.template}"
    runtime = plan.runtimeClassName or "none"
    binding = plan.bindingId or plan.path
    return (
        f"binding {binding}: {granted}, RuntimeClass {runtime}, {ARCH_KEY}={plan.arch}, the "
        f"planned image, on node {PodView(pod).node_name}"
    )


def check_grant(
    pod: Mapping[str, Any],
    profile: VerifiedProfile | None,
    ctx: PlanContext,
    now: datetime,
    *,
    lapse: Lapse | None = None,
    plan: Plan | str | None = None,
    options: GpuOptions | None = None,
) -> Verdict:
    """The verdict for a bound engine Pod.

    `profile` is the verified revision whose bundle sha256 the plan names (None when the plan
    names none, or the revision is not available: then `lapse` says why, defaulting to "unknown
    revision"). `ctx` is this install's planning context (catalog, recipes, tenant mode); its
    profile and time are replaced here. `now` is the current time, for the window policy.
    `plan` is the Pod's plan annotation as `read_plan` gives it, when the caller has it already.
    `options` is the server's table of GPU options the re-derived plan is made with, if any.
    """
    if plan is None:
        plan = read_plan(pod)
    if isinstance(plan, str):
        return _false(PLAN_MISSING, plan)
    gate = device_gate(pod, plan)
    if gate.refused:
        return _false(UNPLANNED_DEVICE_ACCESS, gate.reason)
    if not plan.local:
        return _false(
            PLAN_MISMATCH,
            f"the plan's path is {plan.path!r}; only a gpu or cpu plan creates a workload",
        )
    findings = pod_findings(pod, plan)
    if findings:
        return _false(findings[0][0], "; ".join(text for _, text in findings))
    digest = plan.bundle_sha256
    if lapse is None:
        lapse = catalog_lapse(ctx)
    if lapse is not None:
        return _lapse(pod, lapse, VERIFIED_REVISION_UNAVAILABLE)
    if digest is not None and profile is None:
        return _lapse(
            pod,
            Lapse(
                PROFILE_REVISION_UNKNOWN,
                f"no profile ConfigMap in the namespace carries bundle sha256 {digest}, the "
                "revision the Pod was planned with",
            ),
            VERIFIED_REVISION_UNAVAILABLE,
        )
    if profile is not None and digest != profile.sha256:
        return _false(
            PLAN_MISMATCH,
            f"the plan names bundle sha256 {digest}, not the revision it is checked against "
            f"({profile.sha256})",
        )
    mismatch = _rederive(pod, plan, profile, ctx, now, options)
    if mismatch is not None:
        return mismatch
    if profile is not None:
        try:
            profile.check_window(now)
        except ProfileRefused as refusal:
            return _lapse(
                pod,
                Lapse(
                    PROFILE_EXPIRED,
                    f"{_revision_text(profile)} is outside its window: {refusal.check}",
                ),
                VERIFIED_PROFILE_EXPIRED,
            )
    source = _revision_text(profile) if profile is not None else "this install's settings"
    return Verdict(
        "True",
        VERIFIED,
        clip(f"the Pod runs its plan ({_grant_summary(pod, plan)}), as {source} plans it"),
    )


def check_placement(
    pod: Mapping[str, Any],
    plan: Plan,
    revisions: Mapping[str, object],
    current: VerifiedProfile | None,
    ctx: PlanContext,
    now: datetime,
    options: GpuOptions | None = None,
) -> Verdict:
    """The grant check a Pod passes before it is placed (the owner's extender asks this, since
    the plan was written by the tenant's webhook). A GPU plan gets `check_grant` against the
    verified revision it names (from `revisions` by bundle sha256, or `current` when that is
    the one). A CPU plan grants no device, so it is held to the plan itself (no accelerator,
    every container shielded) and is placed whatever the profile's state."""
    if plan.path == "cpu":
        findings = pod_findings(pod, plan)
        if findings:
            return _false(findings[0][0], "; ".join(text for _, text in findings))
        return Verdict("True", VERIFIED, f"the Pod runs its CPU plan ({_grant_summary(pod, plan)})")
    digest = plan.bundle_sha256
    known = revisions.get(digest) if digest is not None else None
    profile = known if isinstance(known, VerifiedProfile) else None
    if profile is None and current is not None and current.sha256 == digest:
        profile = current
    return check_grant(pod, profile, ctx, now, plan=plan, options=options)


def scheduling_verdict(pod: Mapping[str, Any], now: datetime, timeout_seconds: float) -> Evaluation:
    """An unbound Pod: nothing until `timeout_seconds` after creation, then SchedulingTimeout with
    the scheduler's last word, so a Pod stuck Pending says why instead of staying silent."""
    created = created_at(pod) or now
    waited = (now - created).total_seconds()
    if waited < timeout_seconds:
        return Evaluation(None, timeout_seconds - waited)
    scheduled = PodView(pod).condition("PodScheduled")
    said = scheduled.get("message") if scheduled is not None else None
    reason = scheduled.get("reason") if scheduled is not None else None
    if isinstance(said, str) and said:
        last = f"the scheduler's last message: {said}"
    elif reason == "SchedulingGated":
        last = "the Pod is held by scheduling gates"
    else:
        last = "the scheduler has not reported on this Pod"
    return Evaluation(
        _false(
            SCHEDULING_TIMEOUT,
            f"not scheduled within {int(timeout_seconds)}s of creation "
            f"({format_timestamp(created)}); {last}",
        )
    )


def evaluate(
    pod: Mapping[str, Any],
    revisions: Mapping[str, VerifiedProfile | Lapse],
    ctx: PlanContext,
    now: datetime,
    *,
    scheduling_timeout: float = DEFAULT_SCHEDULING_TIMEOUT,
    lapse: Lapse | None = None,
    options: GpuOptions | None = None,
) -> Evaluation:
    """The whole decision for one engine Pod: bound, it gets the grant check; unbound, the
    scheduling deadline. `revisions` maps bundle sha256 to the verified revision or to why the
    ConfigMap carrying it was refused. `recheck_after` is when time alone changes the answer
    (the scheduling deadline, or the revision's expiry)."""
    size = too_large(pod)
    if size is not None:
        return Evaluation(
            _false(
                POD_TOO_LARGE,
                f"the Pod is {size} bytes as stored, more than the {MAX_KEPT_POD_BYTES} the "
                "allocation controller keeps of one, so its grant was not checked; an engine "
                "Pod as the tenant webhook plans it is a few KiB",
            ),
            None,
        )
    if PodView(pod).node_name is None:
        return scheduling_verdict(pod, now, scheduling_timeout)
    plan = read_plan(pod)
    digest = None if isinstance(plan, str) else plan.bundle_sha256
    known = revisions.get(digest) if digest is not None else None
    profile = known if isinstance(known, VerifiedProfile) else None
    if lapse is None:
        lapse = catalog_lapse(ctx)
    if lapse is None and isinstance(known, Lapse):
        lapse = known
    verdict = check_grant(pod, profile, ctx, now, lapse=lapse, plan=plan, options=options)
    recheck = None
    if profile is not None and verdict.reason == VERIFIED:
        recheck = max(profile.seconds_until_expiry(now), 0.0)
    return Evaluation(verdict, recheck)


def departed_verdict() -> Verdict:
    """For a Pod that was verified as an engine Pod and has since lost the engine label: it left
    the set of Pods being re-checked, so the grant it claims is no longer vouched for."""
    return _false(
        ENGINE_LABEL_REMOVED,
        f"the {ENGINE_LABEL} label was removed, so the grant is no longer checked; restore the "
        "label to have the Pod verified again",
    )


def catalog_lapse(ctx: PlanContext) -> Lapse | None:
    """Why no plan can be re-derived while a configured recipe catalog cannot be used (the
    planner would refuse it, `planner.decide`), naming every such catalog."""
    missing = unavailable(ctx.gpu_recipes, ctx.cpu_recipes)
    if not missing:
        return None
    return Lapse(
        RECIPE_CATALOG_UNAVAILABLE,
        "; ".join(given.problem for given in missing)
        + ", so the plan cannot be checked against the core",
    )


def refused_lapse(configmap_name: str, refusal: ProfileRefused) -> Lapse:
    """The Lapse for a revision whose ConfigMap the verifier refused."""
    return Lapse(
        PROFILE_REFUSED,
        f"profile ConfigMap {configmap_name} was refused: {refusal.authorization_message} "
        f"({refusal.check})",
    )


__all__ = [
    "CONDITION_TYPE",
    "DEFAULT_SCHEDULING_TIMEOUT",
    "ENGINE_LABEL_REMOVED",
    "IMAGE_MISMATCH",
    "NODE_SELECTOR_MISMATCH",
    "PLAN_MISMATCH",
    "PLAN_MISSING",
    "PROFILES_UNREADABLE",
    "PROFILE_EXPIRED",
    "PROFILE_REFUSED",
    "PROFILE_REVISION_UNKNOWN",
    "RECIPE_CATALOG_UNAVAILABLE",
    "RESOURCES_MISMATCH",
    "RUNTIME_CLASS_MISMATCH",
    "SCHEDULING_TIMEOUT",
    "UNPLANNED_DEVICE_ACCESS",
    "VERIFIED",
    "VERIFIED_PROFILE_EXPIRED",
    "VERIFIED_REVISION_UNAVAILABLE",
    "Evaluation",
    "Lapse",
    "Verdict",
    "catalog_lapse",
    "check_grant",
    "check_placement",
    "clip",
    "evaluate",
    "plan_revision",
    "read_plan",
    "refused_lapse",
    "scheduling_verdict",
]
