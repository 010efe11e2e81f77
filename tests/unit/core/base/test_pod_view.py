"""The one Pod view (`inference_policy.base.pod_view`): a stored Pod reads right, a field of the
wrong shape at any level reads as absent and never raises, and nothing is read before an
accessor is called (the tenant-input guard records every key an owner part reads).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_policy.base.pod_view import ObjectView, PodView, as_mapping, is_map
from inference_policy.base.wire import ALLOCATION_VERIFIED, ENGINE_LABEL, PLAN_ANNOTATION
from tests.recording import Reads, recorded

# Values of every JSON shape but the one a field should have (for each field, some are right).
GARBAGE: tuple[Any, ...] = (None, 0, 7, 1.5, True, "", "text", [], [1, "a"], {}, {"x": 1})


def stored_pod() -> dict[str, Any]:
    """An engine Pod as the API server returns it, bound and verified."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "engine-0",
            "generateName": "engine-",
            "namespace": "kamiwaza",
            "uid": "7c1e6f0a-0000-4000-8000-000000000001",
            "resourceVersion": "4711",
            "creationTimestamp": "2026-11-29T12:00:00Z",
            "deletionTimestamp": "2026-11-29T13:00:00Z",
            "labels": {ENGINE_LABEL: "d-1", "app": "llm"},
            "annotations": {PLAN_ANNOTATION: '{"status":200}', "example.com/n": "1"},
        },
        "spec": {
            "nodeName": "gpu-1",
            "schedulerName": "kamiwaza-scheduler",
            "nodeSelector": {"kubernetes.io/arch": "amd64"},
            "containers": [
                {"name": "engine", "image": "llama:1"},
                {"name": "sidecar", "image": "proxy:1"},
            ],
            "initContainers": [{"name": "fetch", "restartPolicy": "Always"}],
            "ephemeralContainers": [{"name": "debug"}],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": ALLOCATION_VERIFIED, "status": "True", "reason": "Verified"},
            ],
        },
    }


def everything(view: PodView) -> dict[str, Any]:
    """Every accessor's answer."""
    return {
        "metadata": dict(view.metadata),
        "spec": dict(view.spec),
        "status": dict(view.status),
        "name": view.name,
        "generate_name": view.generate_name,
        "namespace": view.namespace,
        "uid": view.uid,
        "resource_version": view.resource_version,
        "creation_timestamp": view.creation_timestamp,
        "deletion_timestamp": view.deletion_timestamp,
        "labels": dict(view.labels),
        "annotations": dict(view.annotations),
        "label": view.label(ENGINE_LABEL),
        "annotation": view.annotation(PLAN_ANNOTATION),
        "is_engine_pod": view.is_engine_pod,
        "node_name": view.node_name,
        "scheduler_name": view.scheduler_name,
        "node_selector": dict(view.node_selector),
        "containers": list(view.containers),
        "init_containers": list(view.init_containers),
        "ephemeral_containers": list(view.ephemeral_containers),
        "positioned": view.positioned("containers"),
        "container_at": dict(view.container_at("containers", 1)),
        "container_named": view.container_named("engine"),
        "phase": view.phase,
        "conditions": list(view.conditions),
        "condition": view.condition(ALLOCATION_VERIFIED),
    }


ABSENT: dict[str, Any] = {
    "metadata": {},
    "spec": {},
    "status": {},
    "name": None,
    "generate_name": None,
    "namespace": None,
    "uid": None,
    "resource_version": None,
    "creation_timestamp": None,
    "deletion_timestamp": None,
    "labels": {},
    "annotations": {},
    "label": None,
    "annotation": None,
    "is_engine_pod": False,
    "node_name": None,
    "scheduler_name": None,
    "node_selector": {},
    "containers": [],
    "init_containers": [],
    "ephemeral_containers": [],
    "positioned": [],
    "container_at": {},
    "container_named": None,
    "phase": None,
    "conditions": [],
    "condition": None,
}


# -- a stored Pod ------------------------------------------------------------------------------


def test_a_stored_pod_reads_right() -> None:
    pod = stored_pod()
    view = PodView(pod)
    assert view.raw is pod
    assert view.name == "engine-0"
    assert view.generate_name == "engine-"
    assert view.namespace == "kamiwaza"
    assert view.uid == "7c1e6f0a-0000-4000-8000-000000000001"
    assert view.resource_version == "4711"
    assert view.creation_timestamp == "2026-11-29T12:00:00Z"
    assert view.deletion_timestamp == "2026-11-29T13:00:00Z"
    assert view.labels == {ENGINE_LABEL: "d-1", "app": "llm"}
    assert view.label("app") == "llm"
    assert view.label("absent") is None
    assert view.annotation(PLAN_ANNOTATION) == '{"status":200}'
    assert view.is_engine_pod
    assert view.node_name == "gpu-1"
    assert view.scheduler_name == "kamiwaza-scheduler"
    assert view.node_selector == {"kubernetes.io/arch": "amd64"}
    assert [c["name"] for c in view.containers] == ["engine", "sidecar"]
    assert [c["name"] for c in view.init_containers] == ["fetch"]
    assert [c["name"] for c in view.ephemeral_containers] == ["debug"]
    assert [c["name"] for c in view.containers_of("initContainers")] == ["fetch"]
    assert [(i, c["name"]) for i, c in view.positioned("containers")] == [
        (0, "engine"),
        (1, "sidecar"),
    ]
    assert view.container_at("containers", 1)["image"] == "proxy:1"
    assert view.container_at("containers", 2) == {}
    assert view.container_at("containers", -1) == {}
    assert view.container_named("sidecar") == {"name": "sidecar", "image": "proxy:1"}
    assert view.container_named("nothing") is None
    assert view.phase == "Running"
    assert [c["type"] for c in view.conditions] == ["PodScheduled", ALLOCATION_VERIFIED]
    assert view.condition(ALLOCATION_VERIFIED) == {
        "type": ALLOCATION_VERIFIED,
        "status": "True",
        "reason": "Verified",
    }
    assert view.condition("Ready") is None


def test_what_is_handed_out_is_the_pods_own_not_a_copy() -> None:
    """So what a caller reads of a mapping or a container is read of the Pod itself."""
    pod = stored_pod()
    view = PodView(pod)
    assert view.metadata is pod["metadata"]
    assert view.annotations is pod["metadata"]["annotations"]
    assert view.containers is pod["spec"]["containers"]
    assert view.containers[0] is pod["spec"]["containers"][0]
    assert view.condition("PodScheduled") is pod["status"]["conditions"][0]


def test_other_objects_read_through_the_object_view() -> None:
    configmap = {
        "kind": "ConfigMap",
        "metadata": {"name": "profiles", "namespace": "kamiwaza", "resourceVersion": "9"},
        "data": {"bundle": "{}"},
    }
    lease = {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "ctrl-0"}}
    assert ObjectView(configmap).name == "profiles"
    assert ObjectView(configmap).resource_version == "9"
    assert ObjectView(lease).spec["holderIdentity"] == "ctrl-0"
    assert ObjectView(None).name is None
    assert ObjectView({"metadata": {"resourceVersion": 9}}).resource_version is None


def test_the_view_is_frozen_and_slotted() -> None:
    view = PodView(stored_pod())
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.raw = {}  # type: ignore[misc]
    assert not hasattr(view, "__dict__")
    assert PodView(view.raw) == view


# -- malformed shapes read as absent -----------------------------------------------------------


@pytest.mark.parametrize("raw", (*GARBAGE, "pod"), ids=repr)
def test_a_pod_of_no_shape_reads_as_all_absent(raw: Any) -> None:
    if raw == {}:
        raw = {"unrelated": 1}
    assert everything(PodView(raw)) == ABSENT


@pytest.mark.parametrize("value", [v for v in GARBAGE if not isinstance(v, dict)], ids=repr)
@pytest.mark.parametrize("part", ["metadata", "spec", "status"])
def test_a_part_of_the_wrong_shape_reads_as_absent(part: str, value: Any) -> None:
    pod = stored_pod()
    pod[part] = value
    found = everything(PodView(pod))
    gone = {
        "metadata": (
            "metadata name generate_name namespace uid resource_version creation_timestamp "
            "deletion_timestamp labels annotations label annotation is_engine_pod"
        ),
        "spec": (
            "spec node_name scheduler_name node_selector containers init_containers "
            "ephemeral_containers positioned container_at container_named"
        ),
        "status": "status phase conditions condition",
    }[part].split()
    assert {key: found[key] for key in gone} == {key: ABSENT[key] for key in gone}
    whole = everything(PodView(stored_pod()))
    assert {k: v for k, v in found.items() if k not in gone} == {
        k: v for k, v in whole.items() if k not in gone
    }


@pytest.mark.parametrize("value", [v for v in GARBAGE if not isinstance(v, str)], ids=repr)
@pytest.mark.parametrize(
    ("key", "read"),
    [
        ("name", lambda v: v.name),
        ("generateName", lambda v: v.generate_name),
        ("namespace", lambda v: v.namespace),
        ("uid", lambda v: v.uid),
        ("resourceVersion", lambda v: v.resource_version),
        ("creationTimestamp", lambda v: v.creation_timestamp),
        ("deletionTimestamp", lambda v: v.deletion_timestamp),
    ],
)
def test_a_metadata_field_that_is_no_string_reads_as_absent(
    key: str, read: Callable[[PodView], Any], value: Any
) -> None:
    pod = stored_pod()
    pod["metadata"][key] = value
    assert read(PodView(pod)) is None


@pytest.mark.parametrize("value", [v for v in GARBAGE if not isinstance(v, dict)], ids=repr)
def test_labels_and_annotations_of_the_wrong_shape_read_as_none(value: Any) -> None:
    pod = stored_pod()
    pod["metadata"]["labels"] = value
    pod["metadata"]["annotations"] = value
    view = PodView(pod)
    assert view.labels == {} and view.annotations == {}
    assert view.label(ENGINE_LABEL) is None and view.annotation(PLAN_ANNOTATION) is None
    assert not view.is_engine_pod


@pytest.mark.parametrize("value", [v for v in GARBAGE if not isinstance(v, str)], ids=repr)
def test_a_label_or_annotation_value_that_is_no_string_reads_as_absent(value: Any) -> None:
    pod = stored_pod()
    pod["metadata"]["labels"][ENGINE_LABEL] = value
    pod["metadata"]["annotations"][PLAN_ANNOTATION] = value
    view = PodView(pod)
    assert view.label(ENGINE_LABEL) is None
    assert view.annotation(PLAN_ANNOTATION) is None
    assert not view.is_engine_pod
    # The mappings themselves are as stored: a reader that must tell "absent" from "not a
    # string" (a plan annotation that is no string is refused, not ignored) can.
    assert view.annotations[PLAN_ANNOTATION] == value


@pytest.mark.parametrize("value", [v for v in GARBAGE if not isinstance(v, str)] + [""], ids=repr)
def test_a_node_name_that_is_no_name_reads_as_unbound(value: Any) -> None:
    pod = stored_pod()
    pod["spec"]["nodeName"] = value
    assert PodView(pod).node_name is None


@pytest.mark.parametrize("value", [v for v in GARBAGE if not isinstance(v, list)], ids=repr)
@pytest.mark.parametrize("kind", ["containers", "initContainers", "ephemeralContainers"])
def test_a_container_list_that_is_no_list_reads_as_empty(kind: str, value: Any) -> None:
    pod = stored_pod()
    pod["spec"][kind] = value
    view = PodView(pod)
    assert view.containers_of(kind) == ()
    assert view.positioned(kind) == []
    assert view.container_at(kind, 0) == {}


def test_a_container_entry_that_is_no_object_is_no_container_but_keeps_its_place() -> None:
    """Skipped by every reader, yet counted: an index found here addresses the same container
    in the Pod (a JSON Patch path)."""
    pod = stored_pod()
    pod["spec"]["containers"] = [None, "engine", {"name": "engine"}, 5, {"name": "b"}]
    view = PodView(pod)
    assert [c["name"] for c in view.containers] == ["engine", "b"]
    assert [(i, c["name"]) for i, c in view.positioned("containers")] == [(2, "engine"), (4, "b")]
    assert view.container_at("containers", 0) == {}
    assert view.container_at("containers", 1) == {}
    assert view.container_at("containers", 2) == {"name": "engine"}
    assert view.container_named("engine") == {"name": "engine"}


@pytest.mark.parametrize("value", [v for v in GARBAGE if not isinstance(v, list)], ids=repr)
def test_conditions_that_are_no_list_read_as_none(value: Any) -> None:
    pod = stored_pod()
    pod["status"]["conditions"] = value
    assert PodView(pod).conditions == ()
    assert PodView(pod).condition(ALLOCATION_VERIFIED) is None


def test_a_condition_entry_that_is_no_object_is_skipped() -> None:
    pod = stored_pod()
    pod["status"]["conditions"] = [ALLOCATION_VERIFIED, None, {"type": ALLOCATION_VERIFIED}]
    assert PodView(pod).conditions == [{"type": ALLOCATION_VERIFIED}]
    assert PodView(pod).condition(ALLOCATION_VERIFIED) == {"type": ALLOCATION_VERIFIED}


scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=4)
leaf = scalars | st.lists(scalars, max_size=2)


def objects(keys: list[str], values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A value of any shape where an object with these keys should be, or such an object."""
    return leaf | st.dictionaries(st.sampled_from(keys), values, max_size=len(keys))


strings = objects([ENGINE_LABEL, PLAN_ANNOTATION], leaf | st.just("v"))
METADATA_KEYS = ["name", "generateName", "namespace", "uid", "resourceVersion"]
metadata = objects(
    [*METADATA_KEYS, "creationTimestamp", "deletionTimestamp", "labels", "annotations"],
    leaf | strings,
)
containers = leaf | st.lists(objects(["name", "image"], leaf | st.just("engine")), max_size=3)
spec = objects(
    ["nodeName", "schedulerName", "nodeSelector", "containers", "initContainers"],
    leaf | strings | containers,
)
conditions = leaf | st.lists(
    objects(["type", "status"], leaf | st.just(ALLOCATION_VERIFIED)), max_size=3
)
status = objects(["phase", "conditions"], leaf | conditions)
pods = leaf | st.fixed_dictionaries(
    {}, optional={"metadata": metadata, "spec": spec, "status": status}
)


@settings(max_examples=300, deadline=None)
@given(pods)
def test_no_accessor_raises_whatever_the_shape(raw: Any) -> None:
    everything(PodView(raw))


# -- lazy reads --------------------------------------------------------------------------------


def test_nothing_is_read_until_an_accessor_is_called() -> None:
    reads = Reads()
    view = PodView(recorded(stored_pod(), reads))
    assert reads.paths == {}
    assert view.name == "engine-0"
    assert set(reads.paths) == {"metadata", "metadata.name"}


@pytest.mark.parametrize(
    ("read", "paths"),
    [
        (lambda v: v.uid, {"metadata", "metadata.uid"}),
        (
            lambda v: v.label(ENGINE_LABEL),
            {"metadata", "metadata.labels", f"metadata.labels[{ENGINE_LABEL}]"},
        ),
        (
            lambda v: v.annotation(PLAN_ANNOTATION),
            {"metadata", "metadata.annotations", f"metadata.annotations[{PLAN_ANNOTATION}]"},
        ),
        (lambda v: v.node_name, {"spec", "spec.nodeName"}),
        (lambda v: v.phase, {"status", "status.phase"}),
        (
            lambda v: v.condition("PodScheduled"),
            {"status", "status.conditions", "status.conditions[].type"},
        ),
        (lambda v: v.containers, {"spec", "spec.containers"}),
    ],
)
def test_each_accessor_reads_only_the_keys_it_answers_from(
    read: Callable[[PodView], Any], paths: set[str]
) -> None:
    reads = Reads()
    read(PodView(recorded(stored_pod(), reads)))
    assert set(reads.paths) == paths


# -- the helpers -------------------------------------------------------------------------------


def test_is_map_and_as_mapping() -> None:
    proxy = MappingProxyType({"a": 1})
    assert is_map({}) and is_map(proxy) and not is_map(None) and not is_map([])
    same = {"a": 1}
    assert as_mapping(same) is same
    assert as_mapping(proxy) == {"a": 1} and type(as_mapping(proxy)) is dict
    assert as_mapping([("a", 1)]) == {}
