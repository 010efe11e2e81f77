"""Fuzzing `POST /mutate`: AdmissionReviews for engine and other Pods, CREATE, UPDATE and the
rest, in every shape from well-formed to garbage, against the real webhook app.

Oracles, for every input:

* the HTTP status is 200 for anything that is an AdmissionReview (apiVersion, kind, a request
  with a uid) and 400 for anything that is not; never a 5xx;
* a 200 is a valid AdmissionReview response with the request's uid; a denial carries a 4xx or
  503 code and a message, never the 500 of an internal error; a patch is base64 JSON Patch
  and comes only on an allowed CREATE or UPDATE in the served namespace;
* an allowed engine Pod, with its patch applied, is exactly the Pod the core plans for its
  request (`engine_pod.planned_pod` with the `tmi plan` decision), and reaches for no
  accelerator outside its engine container's grant; an allowed other Pod reaches for none
  (`access.reaches` is empty); an allowed UPDATE adds or raises no reach and keeps the plan;
* the same review with another uid gets the same answer (the webhook remembers answers).

Device variables of every vendor, envFrom prefixes and CDI annotation keys, in, on the edge of
and away from the namespaces the access rule refuses, go on a third of the Pods and into
UPDATEs (`tests.fuzz.devicekit`), and are judged by the rule restated from its text in the test,
which shares no code with the predicate:

* wherever `access.reaches` finds no device variable, envFrom source or CDI key on a reviewed
  Pod (old or new), the restatement finds none either;
* no allowed Pod, as stored (patch applied), carries one the restatement refuses, and no allowed
  UPDATE adds one (the Pod's own predicate is not asked).

A forgery is a Pod that reaches for an accelerator outside a plan, or carries a device variable,
envFrom source or CDI key the restated rule refuses (or an UPDATE that adds or raises a reach,
or touches the plan); each one tried is counted, and a forged grant (an allowed forgery) fails
the target at once. The CEL the API server runs is not evaluated here (no CEL evaluator is
installed); `tests/e2e/admission/test_generated_admission.py` sends a sample of the same device Pods
through the owner's guard policy.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference_policy.admission.engine_pod import engine_container_name, planned_pod
from inference_policy.base import strictjson
from inference_policy.base.access import is_accelerator_resource, new_reaches, reaches
from inference_policy.base.wire import (
    ENGINE_CONTAINER_ANNOTATION,
    ENGINE_LABEL,
    PLAN_ANNOTATION,
    REQUEST_ANNOTATION,
)
from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME
from kits.profilekit import NAMESPACE, NOW
from kits.webhookkit import (
    CPU_SECRET,
    GPU_SECRET,
    SCHEDULER,
    apply_patch,
    published,
    review,
    webhook_app,
)
from tests.fuzz import corpus
from tests.fuzz.devicekit import (
    add_device_surfaces,
    add_one_device_surface,
    cdi_keys,
    device_env,
    device_findings,
    env_from,
    missed_by,
    new_device_findings,
    surfaces,
)
from tests.fuzz.fuzzkit import (
    AppDriver,
    Failure,
    Stats,
    chance,
    fuzz_settings,
    garbled,
    json_values,
    mutated,
    recorded,
)

ACCELERATORS = [
    "nvidia.com/gpu",
    "nvidia.com/mig-3g.40gb",
    "amd.com/gpu",
    "gpu.intel.com/i915",
    "habana.ai/gaudi",
    "kamiwaza.ai/vram-gb-gpu-0",
    "kamiwaza.ai/vram-mib-gpu-0",
]
NATIVE = ["cpu", "memory", "ephemeral-storage", "example.com/widget"]
NAMES = ["engine", "sidecar", "init", "debug"]
DEVICE_ENV = ["NVIDIA_VISIBLE_DEVICES", "AMD_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"]

quantities = st.sampled_from(["1", "2", "8", "0", "500m", "1Gi", "-1", "x"]) | st.integers(0, 9)
resource_maps = st.dictionaries(st.sampled_from(ACCELERATORS + NATIVE), quantities, max_size=3)
resources = st.fixed_dictionaries(
    {},
    optional={
        "requests": resource_maps,
        "limits": resource_maps,
        "claims": st.lists(
            st.fixed_dictionaries({"name": st.sampled_from(["c", "d"])}), max_size=2
        ),
    },
)
env_entries = st.one_of(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from([*DEVICE_ENV, "PATH"]),
            "value": st.sampled_from(["all", "void", "0", "", "none", "VOID"]),
        }
    ),
    st.fixed_dictionaries(
        {"name": st.sampled_from(DEVICE_ENV)},
        optional={
            "value": st.just("void"),
            "valueFrom": st.just({"configMapKeyRef": {"name": "x", "key": "y"}}),
        },
    ),
)


def containers(names: list[str]) -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.tuples(
        *(
            st.fixed_dictionaries(
                {"name": st.just(name), "image": st.sampled_from(["app", "engine:latest"])},
                optional={"resources": resources, "env": st.lists(env_entries, max_size=3)},
            )
            for name in names
        )
    ).map(list)


request_texts = st.one_of(
    st.sampled_from(corpus.requests()).flatmap(lambda r: mutated(r, 2)).map(json.dumps),
    st.sampled_from(corpus.requests()).map(json.dumps),
    st.sampled_from(["", "{", "null", "[]", '{"a":1,"a":2}', "NaN"]),
)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    engine = draw(st.booleans())
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True))
    annotations: dict[str, str] = {}
    if engine and not chance(draw, 5):
        annotations[REQUEST_ANNOTATION] = draw(request_texts)
    if chance(draw, 15):
        annotations[ENGINE_CONTAINER_ANNOTATION] = draw(st.sampled_from(NAMES))
    if chance(draw, 10):
        annotations[PLAN_ANNOTATION] = draw(st.sampled_from([*corpus.plan_texts(), "{}"]))
    # Half the Pods are as a platform writes them (no accelerator of their own), so that many
    # reach planning and come back patched; the rest reach for accelerators in every way.
    clean = chance(draw, 50)
    spec: dict[str, Any] = {
        "containers": [{"name": n, "image": "app"} for n in names]
        if clean
        else draw(containers(names))
    }
    for kind in ("initContainers", "ephemeralContainers"):
        if not clean and chance(draw, 20):
            spec[kind] = draw(containers([f"{kind}-0"]))
    optional = (
        {}
        if clean
        else draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "runtimeClassName": st.sampled_from(["nvidia", "runc", ""]),
                    "nodeName": st.sampled_from(["h100-1", ""]),
                    "resourceClaims": st.lists(st.just({"name": "gpu"}), max_size=1),
                    "resources": resources,
                    "nodeSelector": st.just({"kubernetes.io/arch": "arm64"}),
                    "schedulerName": st.just("default-scheduler"),
                    "imagePullSecrets": st.just([{"name": "mine"}]),
                },
            )
        )
    )
    spec.update(optional)
    # Device variables of every vendor, envFrom prefixes and CDI keys, in and near the refused
    # namespaces, on any Pod (the clean engine Pods too, which would otherwise be planned).
    if chance(draw, 35):
        if draw(st.booleans()):
            add_one_device_surface(draw, spec, annotations)
        else:
            add_device_surfaces(draw, spec, annotations)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "fuzzed",
            "namespace": NAMESPACE,
            "labels": {ENGINE_LABEL: "d-1"} if engine else {"app": "tenant"},
            "annotations": annotations,
        },
        "spec": spec,
    }


def planned_pods() -> list[dict[str, Any]]:
    """Engine Pods as the webhook left them: what an UPDATE starts from."""
    from kits.webhookkit import engine_pod

    found = []
    for document in corpus.requests():
        decision = corpus.state().decide(document, NOW)
        plan = decision.plan
        if plan is None or not plan.local:
            continue
        secret = GPU_SECRET if plan.path == "gpu" else CPU_SECRET
        pod = engine_pod(document)
        found.append(
            planned_pod(pod, 0, plan, plan.text(), scheduler_name=SCHEDULER, pull_secret=secret)
        )
    return found


PLANNED = planned_pods()


UPDATE_CHANGES = [
    *("env", "resources", "plan", "image", "runtime", "extra"),
    *("device-env", "env-from", "cdi", "ephemeral"),
]


@st.composite
def updates(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    old = draw(st.sampled_from(PLANNED) | pods())
    new = json.loads(json.dumps(old))
    spec = new["spec"]
    target = spec["containers"][0]
    for change in draw(st.lists(st.sampled_from(UPDATE_CHANGES))):
        if change == "env":
            target.setdefault("env", []).append(draw(env_entries))
        elif change == "device-env":
            target.setdefault("env", []).append(draw(device_env()))
        elif change == "env-from":
            target.setdefault("envFrom", []).append(draw(env_from()))
        elif change == "cdi":
            annotations = new["metadata"].setdefault("annotations", {})
            annotations[draw(cdi_keys)] = draw(st.sampled_from(["nvidia.com/gpu=all", "x"]))
        elif change == "ephemeral":
            # The one kind of container an UPDATE can add (the ephemeralcontainers resource).
            debug: dict[str, Any] = {"name": f"debug-{len(spec.get('ephemeralContainers', []))}"}
            debug["image"] = "busybox"
            if draw(st.booleans()):
                debug["env"] = draw(st.lists(device_env(), min_size=1, max_size=2))
            else:
                debug["envFrom"] = [draw(env_from())]
            spec.setdefault("ephemeralContainers", []).append(debug)
        elif change == "resources":
            target["resources"] = draw(resources)
        elif change == "plan":
            annotations = new["metadata"].setdefault("annotations", {})
            choice = draw(st.sampled_from([None, "{}", *corpus.plan_texts()]))
            if choice is None:
                annotations.pop(PLAN_ANNOTATION, None)
            else:
                annotations[PLAN_ANNOTATION] = choice
        elif change == "image":
            target["image"] = draw(st.sampled_from(["evil:latest", "app"]))
        elif change == "runtime":
            spec["runtimeClassName"] = "nvidia"
        else:
            spec["containers"].append(draw(containers(["extra"]))[0])
    # Shapes broken anywhere are the business of `review_bodies`, which bends whole reviews.
    return old, new


@st.composite
def review_bodies(draw: st.DrawFn) -> bytes:
    operation = draw(
        st.sampled_from(["CREATE"] * 6 + ["UPDATE"] * 3 + ["DELETE", "CONNECT", "PATCH"])
    )
    old = None
    if operation == "UPDATE":
        old, obj = draw(updates())
    elif operation in ("DELETE", "CONNECT"):
        obj = None
        old = draw(pods())
    else:
        obj = draw(pods())
    namespace = "elsewhere" if chance(draw, 5) else NAMESPACE
    document: Any = review(obj, operation=operation, namespace=namespace, old=old)
    shape = draw(st.sampled_from(["plain"] * 16 + ["kind", "mutated", "mutated", "garbled"]))
    if shape == "kind":
        document["request"]["kind"] = draw(json_values | st.just({"group": "", "kind": "Node"}))
    elif shape == "mutated":
        document = draw(mutated(document, 2))
    body = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    if shape == "garbled":
        body = draw(garbled(body))
    return body


# -- the oracle ---------------------------------------------------------------------------------


def _envelope(body: bytes) -> dict[str, Any] | None:
    """The review's request when `body` is an AdmissionReview at all (else None): what decides
    between 200 and 400, checked here without the webhook's code."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(document, dict):
        return None
    if document.get("apiVersion") != "admission.k8s.io/v1":
        return None
    if document.get("kind") != "AdmissionReview":
        return None
    request = document.get("request")
    if not isinstance(request, dict):
        return None
    uid = request.get("uid")
    return request if isinstance(uid, str) and uid else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _is_pod_review(request: Mapping[str, Any]) -> bool:
    kind, resource = request.get("kind"), request.get("resource")
    return (
        isinstance(kind, Mapping)
        and kind.get("group", "") == ""
        and kind.get("kind") == "Pod"
        and isinstance(resource, Mapping)
        and resource.get("group", "") == ""
        and resource.get("resource") == "pods"
    )


def _engine_asks(pod: Mapping[str, Any], engine: str | None) -> dict[str, dict[str, Any]]:
    """The engine container's accelerator asks, by part (none when the containers are not a
    list: such a Pod is refused as unreadable, and the oracle must not fail on it first)."""
    containers = _mapping(pod.get("spec")).get("containers")
    for container in containers if isinstance(containers, list) else []:
        if isinstance(container, Mapping) and container.get("name") == engine:
            own = _mapping(container.get("resources"))
            return {
                part: {
                    k: v
                    for k, v in _mapping(own.get(part)).items()
                    if is_accelerator_resource(str(k))
                }
                for part in ("requests", "limits")
            }
    return {"requests": {}, "limits": {}}


def _is_engine(pod: Mapping[str, Any]) -> bool:
    return ENGINE_LABEL in _mapping(_mapping(pod.get("metadata")).get("labels"))


def _forgery(request: Mapping[str, Any]) -> bool:
    """Does this review try to reach for an accelerator outside a plan?"""
    pod, old = request.get("object"), request.get("oldObject")
    if not isinstance(pod, Mapping):
        return False
    if request.get("operation") == "UPDATE" and isinstance(old, Mapping):
        before = _mapping(_mapping(old.get("metadata")).get("annotations")).get(PLAN_ANNOTATION)
        after = _mapping(_mapping(pod.get("metadata")).get("annotations")).get(PLAN_ANNOTATION)
        added = new_reaches(pod, old) or new_device_findings(pod, old)
        return bool(added) or before != after
    if device_findings(pod):
        return True
    if not _is_engine(pod):
        return bool(reaches(pod))
    engine = engine_container_name(pod)
    asks = _engine_asks(pod, engine)
    return bool(
        reaches(pod, engine)
        or _mapping(pod.get("spec")).get("nodeName")
        or asks["requests"]
        or asks["limits"]
    )


def check(driver: AppDriver, body: bytes, stats: Stats) -> None:
    request = _envelope(body)
    answer = driver.answer("/mutate", body, request is not None, "an AdmissionReview")
    if request is None:
        stats.saw("http-400")
        return
    response = answer.get("response")
    if answer.get("apiVersion") != "admission.k8s.io/v1" or answer.get("kind") != "AdmissionReview":
        raise Failure(f"the answer is not an AdmissionReview: {answer}")
    if not isinstance(response, dict) or response.get("uid") != request["uid"]:
        raise Failure(f"the answer does not carry the request's uid: {answer}")
    allowed = response.get("allowed")
    if not isinstance(allowed, bool):
        raise Failure(f"allowed is not a boolean: {response}")
    served = request.get("namespace") == NAMESPACE
    pod_review = _is_pod_review(request)
    for obj in (request.get("object"), request.get("oldObject")):
        _agrees(obj)
    stats.tried(*sorted(surfaces(request.get("object"))))
    operation = request.get("operation")
    forgery = pod_review and served and operation in ("CREATE", "UPDATE") and _forgery(request)
    stats.forgeries_tried += forgery
    if not allowed:
        code = _mapping(response.get("status")).get("code")
        message = _mapping(response.get("status")).get("message")
        if not isinstance(code, int) or not (400 <= code < 500 or code == 503):
            raise Failure(f"a denial with code {code!r} (500 is the internal-error path)")
        if not isinstance(message, str) or not message:
            raise Failure(f"a denial without a message: {response}")
        if "patch" in response:
            raise Failure("a denial carries a patch")
        stats.saw(f"denied-{code}")
        return
    if not pod_review:
        raise Failure(f"a review of something other than a Pod was allowed: {request.get('kind')}")
    ops = _patch(response)
    if ops and (operation not in ("CREATE", "UPDATE") or not served):
        raise Failure(f"a patch on {operation} in namespace {request.get('namespace')!r}")
    stats.saw("patched" if ops else "allowed")
    if not served or operation not in ("CREATE", "UPDATE"):
        return
    pod = request["object"]
    final = apply_patch(pod, ops)
    forged = _forged_grant(request, pod, final)
    if forged:
        stats.forged_grants += 1
        raise Failure(f"forged grant: {forged}")
    if forgery:
        stats.saw("forgery-neutralised")


def _agrees(pod: Any) -> None:
    """Where the predicate finds no device variable, envFrom source or CDI key on `pod`, the
    rule restated from its text (`tests.fuzz.devicekit`) finds none either."""
    if not isinstance(pod, Mapping):
        return
    findings = device_findings(pod)
    fields = [r.field for r in reaches(pod) if r.kind in ("env", "annotation")]
    missed = missed_by(fields, findings)
    if missed:
        raise Failure(f"the access predicate misses {missed} on {json.dumps(pod)[:2000]}")


def _patch(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    if "patch" not in response:
        return []
    if response.get("patchType") != "JSONPatch":
        raise Failure(f"a patch without patchType JSONPatch: {response}")
    ops = json.loads(base64.b64decode(response["patch"], validate=True))
    if not isinstance(ops, list) or not ops:
        raise Failure(f"the patch is not a non-empty JSON Patch: {ops}")
    return ops


def _forged_grant(request: Mapping[str, Any], pod: Any, final: Any) -> str | None:
    """Why the allowed Pod, as stored, holds accelerator access no plan granted (None: it
    holds none)."""
    if request.get("operation") == "UPDATE":
        old = request["oldObject"]
        devices = new_device_findings(final, old)
        if devices:
            return f"an UPDATE added device variables or CDI annotations {devices}"
        added = new_reaches(final, old)
        if added:
            return f"an UPDATE added {added}"
        before = _mapping(_mapping(old.get("metadata")).get("annotations")).get(PLAN_ANNOTATION)
        after = _mapping(_mapping(final.get("metadata")).get("annotations")).get(PLAN_ANNOTATION)
        return None if before == after else "an UPDATE changed the plan annotation"
    devices = device_findings(final)
    if devices:
        return f"the stored Pod holds device variables or CDI annotations {devices}"
    if not _is_engine(pod):
        found = reaches(final)
        return f"a Pod without a plan reaches {found}" if found else None
    text = pod["metadata"]["annotations"][REQUEST_ANNOTATION]
    decision = corpus.state().decide(strictjson.loads(text), NOW)
    plan = decision.plan
    if plan is None or not plan.local:
        return f"an engine Pod was allowed though its request is refused: {decision.body}"
    engine = engine_container_name(pod)
    index = next(i for i, c in enumerate(pod["spec"]["containers"]) if c["name"] == engine)
    secret = GPU_SECRET if plan.path == "gpu" else CPU_SECRET
    wanted = planned_pod(
        pod, index, plan, plan.text(), scheduler_name=SCHEDULER, pull_secret=secret
    )
    if final != wanted:
        return f"the stored Pod is not the planned Pod:\n{final}\n!=\n{wanted}"
    extra = reaches(final, engine)
    if extra or _mapping(final.get("spec")).get("nodeName"):
        return f"the planned Pod reaches outside its engine container: {extra}"
    granted = {k: v for k, v in plan.requests.items() if is_accelerator_resource(k)}
    asks = _engine_asks(final, engine)
    if asks["requests"] != granted:
        return f"the engine container asks {asks['requests']}, the plan grants {granted}"
    if plan.path == "gpu" and asks["limits"] != granted:
        return f"the engine container's limits {asks['limits']} are not the grant {granted}"
    return None


# -- the targets --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def driver() -> Iterator[AppDriver]:
    configmaps = {DEFAULT_CONFIGMAP_NAME: published(corpus.OWNER.sign(corpus.ENVELOPE))}
    app, _, _ = webhook_app(corpus.OWNER, configmaps, **corpus.WEBHOOK_SETTINGS)
    driver = AppDriver(app)
    yield driver
    driver.close()


def test_fuzz_admission_reviews(driver: AppDriver) -> None:
    with recorded(Stats("admission-reviews")) as stats:

        @fuzz_settings(300)
        @given(review_bodies(), st.booleans())
        def run(body: bytes, replay: bool) -> None:
            check(driver, body, stats)
            request = _envelope(body)
            if replay and request is not None:
                # The same review under another uid: the same answer but for the uid.
                uid = request["uid"]
                again = body.replace(orjson.dumps(uid), orjson.dumps(uid + "-again"), 1)
                first = orjson.loads(driver.post("/mutate", body)[1])["response"]
                second = orjson.loads(driver.post("/mutate", again)[1])["response"]
                assert second.pop("uid") == uid + "-again"
                first.pop("uid")
                assert first == second

        run()
    assert stats.forged_grants == 0
    assert stats.inputs > 0
