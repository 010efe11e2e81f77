"""A Pod, or any other Kubernetes object, read as the API server stored it: every field the
servers and the core read of one, read in one place.

Why it exists: the tenant writes its Pods (and its webhook writes what it likes into them), so a
stored Pod may hold any shape where a field should be, and the webhook, the scheduler extender,
the allocation controller and the core each read the same few fields of it (name, namespace,
uid, labels, annotations, node, containers, conditions). Read ad hoc, each read decides anew what
a field of the wrong shape means, and the one that forgets raises in a server. Here the answer is
written once: a field of the wrong shape at any level reads as absent, and no accessor raises.

`PodView` (a Pod) and `ObjectView` (any object: ConfigMaps, Leases, Nodes, TenantAdmissions,
ResourceClaims, List metadata) wrap the decoded mapping without copying or parsing it. Each
accessor reads only the keys it answers from, and only when it is called: the guard that holds
the owner parts to the tenant-input inventory records every key read of a Pod
(`tests/integration/serving/test_tenant_inputs_read.py`), so a view that parsed the whole Pod
up front would read every field the inventory says is never read. Mappings and lists are handed
out as stored, not copied (a list is filtered only when it holds an entry that is no object),
so what a caller reads of them is read of the Pod itself.

Writing stays with the callers: a view is for reading, and a patch or a kept copy of an object
is built as a dict where it is made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from inference_policy.base.wire import ENGINE_LABEL


def is_map(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """`value` is a JSON object (a mapping)."""
    # dict first: every object here was decoded from JSON, and the ABC check costs ten times
    # more; an absent field (None) is answered before it, as it is most of what is not a dict.
    return type(value) is dict or (value is not None and isinstance(value, Mapping))


def as_mapping(value: Any) -> dict[str, Any]:
    """`value` as a dict: itself when it is one (what JSON decodes to), a copy of another
    mapping, else empty."""
    if type(value) is dict:
        return value
    return dict(value) if is_map(value) else {}


# The readers below test `type(...) is dict` before calling `is_map`: the admission webhook and
# the extender read a Pod through them on every review and scheduling cycle, and a decoded
# Pod's objects are all dicts, so the common case costs no call.


def mapping_at(obj: object, key: str) -> Mapping[str, Any]:
    """The object under `key` of `obj`, as stored; empty when either is not an object (a new
    dict each time: what a reader gets may be encoded or copied like any decoded object)."""
    if type(obj) is not dict and not is_map(obj):
        return {}
    value = obj.get(key)
    return value if type(value) is dict or is_map(value) else {}


def text_at(obj: Mapping[str, Any], key: str) -> str | None:
    """The string under `key`; None when absent or not a string."""
    value = obj.get(key)
    return value if isinstance(value, str) else None


def objects_in(value: object) -> Sequence[Mapping[str, Any]]:
    """The entries of a list which are objects, in order; empty when `value` is no list. The
    list itself when every entry is one (as the API server stores them)."""
    if not isinstance(value, list):
        return ()
    for entry in value:
        if type(entry) is not dict and not is_map(entry):
            return [entry for entry in value if is_map(entry)]
    return value


def positions_in(value: object) -> list[tuple[int, Mapping[str, Any]]]:
    """Each entry of a list which is an object, with its position in the list (entries of
    another shape skipped, yet counted); empty when `value` is no list."""
    out: list[tuple[int, Mapping[str, Any]]] = []
    if isinstance(value, list):
        for index, entry in enumerate(value):
            if type(entry) is dict or is_map(entry):
                out.append((index, entry))
    return out


@dataclass(frozen=True, slots=True)
class ObjectView:
    """Any Kubernetes object as stored (`raw`, of any shape): its metadata, spec and status."""

    raw: object

    @property
    def metadata(self) -> Mapping[str, Any]:
        return mapping_at(self.raw, "metadata")

    @property
    def spec(self) -> Mapping[str, Any]:
        return mapping_at(self.raw, "spec")

    @property
    def status(self) -> Mapping[str, Any]:
        return mapping_at(self.raw, "status")

    @property
    def name(self) -> str | None:
        return text_at(mapping_at(self.raw, "metadata"), "name")

    @property
    def generate_name(self) -> str | None:
        return text_at(mapping_at(self.raw, "metadata"), "generateName")

    @property
    def namespace(self) -> str | None:
        return text_at(mapping_at(self.raw, "metadata"), "namespace")

    @property
    def uid(self) -> str | None:
        return text_at(mapping_at(self.raw, "metadata"), "uid")

    @property
    def resource_version(self) -> str | None:
        return text_at(mapping_at(self.raw, "metadata"), "resourceVersion")

    @property
    def creation_timestamp(self) -> str | None:
        """As stored (a Kubernetes Time, `...Z`); parsing it is the reader's."""
        return text_at(mapping_at(self.raw, "metadata"), "creationTimestamp")

    @property
    def deletion_timestamp(self) -> str | None:
        return text_at(mapping_at(self.raw, "metadata"), "deletionTimestamp")

    @property
    def labels(self) -> Mapping[str, Any]:
        """The labels as stored. The API server stores strings only; a reader that decides
        something by a value still checks it is one (`label`)."""
        return mapping_at(mapping_at(self.raw, "metadata"), "labels")

    @property
    def annotations(self) -> Mapping[str, Any]:
        """The annotations as stored (see `labels`)."""
        return mapping_at(mapping_at(self.raw, "metadata"), "annotations")

    def label(self, key: str) -> str | None:
        """The label's value; None when absent or not a string. Reads that one key only."""
        return text_at(mapping_at(mapping_at(self.raw, "metadata"), "labels"), key)

    def annotation(self, key: str) -> str | None:
        """The annotation's value; None when absent or not a string. Reads that one key only."""
        return text_at(mapping_at(mapping_at(self.raw, "metadata"), "annotations"), key)


@dataclass(frozen=True, slots=True)
class PodView(ObjectView):
    """A Pod as stored: what the servers and the core read of one."""

    @property
    def is_engine_pod(self) -> bool:
        """It carries the engine label (`kamiwaza.ai/deployment-id`), with a string value."""
        return self.label(ENGINE_LABEL) is not None

    @property
    def node_name(self) -> str | None:
        """The node it is bound to; None while unbound (absent, empty or not a string)."""
        return text_at(mapping_at(self.raw, "spec"), "nodeName") or None

    @property
    def scheduler_name(self) -> str | None:
        return text_at(mapping_at(self.raw, "spec"), "schedulerName")

    @property
    def node_selector(self) -> Mapping[str, Any]:
        return mapping_at(mapping_at(self.raw, "spec"), "nodeSelector")

    @property
    def containers(self) -> Sequence[Mapping[str, Any]]:
        return objects_in(mapping_at(self.raw, "spec").get("containers"))

    @property
    def init_containers(self) -> Sequence[Mapping[str, Any]]:
        return objects_in(mapping_at(self.raw, "spec").get("initContainers"))

    @property
    def ephemeral_containers(self) -> Sequence[Mapping[str, Any]]:
        return objects_in(mapping_at(self.raw, "spec").get("ephemeralContainers"))

    def containers_of(self, kind: str) -> Sequence[Mapping[str, Any]]:
        """The entries of that container list which are objects, in order (an entry of another
        shape is no container); empty when the list is absent or not a list."""
        return objects_in(mapping_at(self.raw, "spec").get(kind))

    def positioned(self, kind: str) -> list[tuple[int, Mapping[str, Any]]]:
        """Each container of that list with its position in the list as stored (entries of
        another shape skipped, yet counted): the index a patch addresses it by."""
        return positions_in(mapping_at(self.raw, "spec").get(kind))

    def container_at(self, kind: str, index: int) -> Mapping[str, Any]:
        """The container at that position of the list as stored; empty when there is none or
        it is not an object."""
        entries = mapping_at(self.raw, "spec").get(kind)
        if not isinstance(entries, list) or not 0 <= index < len(entries):
            return {}
        entry = entries[index]
        return entry if is_map(entry) else {}

    def container_named(self, name: object) -> Mapping[str, Any] | None:
        """The first of `spec.containers` with that name; None when there is none."""
        for container in self.containers:
            if container.get("name") == name:
                return container
        return None

    @property
    def phase(self) -> str | None:
        return text_at(mapping_at(self.raw, "status"), "phase")

    @property
    def conditions(self) -> Sequence[Mapping[str, Any]]:
        """The status conditions which are objects, in order."""
        return objects_in(mapping_at(self.raw, "status").get("conditions"))

    def condition(self, condition_type: str) -> Mapping[str, Any] | None:
        """The first condition of that type; None when there is none."""
        for entry in self.conditions:
            if entry.get("type") == condition_type:
                return entry
        return None


__all__ = [
    "ObjectView",
    "PodView",
    "as_mapping",
    "is_map",
    "mapping_at",
    "objects_in",
    "positions_in",
    "text_at",
]
