"""Property tests: no input crashes the parsers or the planner, and canonical forms are stable."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference_policy.base import strictjson
from inference_policy.planning.plan import Plan, parse_plan
from inference_policy.planning.planner import decide
from inference_policy.trust.profile import ProfileSchemaError, parse_envelope
from inference_policy.trust.signing import ProfileRefused, canonical, verify_configmap
from kits.profilekit import NOW, Owner, request

OWNER = Owner()
STATE = OWNER.state()
CONTEXT = STATE.context(NOW)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.text(max_size=20)
    | st.floats(  # JSON numbers that read back as a float or a safe integer
        min_value=-(2.0**53) + 1, max_value=2.0**53 - 1, allow_nan=False, width=64
    )
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)

REQUEST_KEYS = [
    "schemaVersion",
    "engine",
    "external",
    "gpu_allocation",
    "vram_allocation",
    "model",
    "config",
    "inferenceResources",
]


@st.composite
def mutated_requests(draw: st.DrawFn) -> Any:
    document: dict[str, Any] = request(
        draw(st.sampled_from(["llamacpp", "vllm", "diffusion", "whispercpp", "mlx"]))
    )
    for _ in range(draw(st.integers(0, 4))):
        section = draw(st.sampled_from(["", "model", "config"]))
        target = document if not section else document.setdefault(section, {})
        if not isinstance(target, dict):
            break
        key = draw(
            st.sampled_from(
                [
                    *REQUEST_KEYS,
                    "name",
                    "format",
                    "weightsBytes",
                    "contextLength",
                    "layers",
                    "max_model_len",
                    "tensor_parallel_size",
                    "force_cpu",
                    "embedding",
                    "pooling",
                    "lora",
                ]
            )
        )
        target[key] = draw(json_values)
    return document


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(mutated_requests())
def test_planner_never_crashes_on_requests(document: Any) -> None:
    decision = decide(document, CONTEXT)
    assert decision.status in (200, 422, 503)
    assert decision.body["status"] == decision.status
    if decision.status != 200:
        assert isinstance(decision.body["detail"], str) and decision.body["detail"]
        assert decision.code is not None
    else:
        # The planner constructs its plans without validation on the decision path; every plan
        # it builds must nevertheless be one the one plan parser accepts, byte for byte.
        assert decision.plan is not None
        assert parse_plan(decision.plan.text()).text() == decision.plan.text()
        assert Plan.model_validate(decision.body) == decision.plan


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_planner_never_crashes_on_any_json(document: Any) -> None:
    assert decide(document, CONTEXT).status in (200, 422, 503)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_strict_json_only_raises_its_own_error(data: bytes) -> None:
    with contextlib.suppress(strictjson.StrictJSONError):
        strictjson.loads(data)


ENVELOPE_PATHS = [
    ("version",),
    ("clusterBindingId",),
    ("issuedAt",),
    ("profiles", 1, "bindings", 0, "capacity"),
    ("profiles", 1, "bindings", 0, "accelerator", "cudaDriverMajor"),
    ("profiles", 2, "bindings", 0, "resource"),
    ("profiles", 0, "guarantees"),
    ("profiles",),
    ("profiles", 1, "bindings", 0, "nodeSelector"),
    ("keyId",),
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ENVELOPE_PATHS), json_values)
def test_envelope_parser_never_crashes(path: tuple[Any, ...], value: Any) -> None:
    envelope: Any = OWNER.envelope()
    target = envelope
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    try:
        parse_envelope(envelope)
    except ProfileSchemaError as exc:
        assert str(exc)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(ENVELOPE_PATHS), json_values)
def test_signed_mutations_verify_or_refuse(path: tuple[Any, ...], value: Any) -> None:
    envelope: Any = OWNER.envelope()
    target = envelope
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    try:
        configmap = OWNER.sign(envelope)
    except ValueError:
        return  # not representable as canonical JSON: signing refuses before anything is emitted
    try:
        verify_configmap(configmap, OWNER.policy(), NOW)
    except ProfileRefused as refusal:
        assert refusal.check


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_canonical_round_trip_is_stable(value: Any) -> None:
    try:
        first = canonical(value)
    except ValueError:
        return
    again = canonical(json.loads(first))
    assert again == first
    assert canonical(strictjson.loads(first)) == first
