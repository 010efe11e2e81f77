"""The controller's view of the API server: three small ports and the errors they raise.

The reconcile logic, the informers (`serving.informer`, whose `ListWatch` is the third port)
and the leader elector each talk to the API server only through these protocols, so the same
code runs against the real API server (`kubeapi.HttpKube`) and against the in-memory fake
(`memory.MemoryKube`) that the tests and the benchmark use.
Objects cross the ports as plain JSON dicts, as the API server sends them: the controller reads
a handful of fields and writes small patches, so typed models would only add a translation step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from serving.informer import JSON, ListWatch
from serving.kube import ApiError, Conflict, Gone, NotFound, api_error

# The errors are the shared ones, named here too so the controller's modules import one place.
__all__ = [
    "JSON",
    "AccessPort",
    "ApiError",
    "ClaimReader",
    "Conflict",
    "Gone",
    "KubePort",
    "LeasePort",
    "ListWatch",
    "NotFound",
    "PodPort",
    "api_error",
]


class PodPort(Protocol):
    """What the reconciler needs: read one Pod, patch its status, record an Event."""

    @property
    def namespace(self) -> str: ...

    async def get_pod(self, name: str, *, fresh: bool = False) -> JSON | None:
        """The Pod as last known (`fresh`: read from the API server, not a cache); None if gone."""

    async def list_pods(self, label_selector: str) -> list[JSON]:
        """Every Pod in the namespace that the label selector matches."""

    async def patch_pod_status(self, name: str, patch: Mapping[str, Any]) -> JSON:
        """A strategic merge patch on pods/status; returns the updated Pod."""

    async def create_event(self, event: Mapping[str, Any]) -> None:
        """Create an events.k8s.io/v1 Event in the namespace."""


class ClaimReader(Protocol):
    """A DRA engine Pod's ResourceClaim and the ResourceSlices of its node."""

    async def get_resource_claim(self, name: str) -> JSON | None: ...

    async def list_resource_slices(self, node: str) -> list[JSON]: ...


class LeasePort(Protocol):
    """What the leader elector needs: a coordination.k8s.io/v1 Lease, read and written with
    optimistic concurrency (a stale resourceVersion is a Conflict)."""

    async def get_lease(self, name: str) -> JSON | None: ...

    async def create_lease(self, lease: Mapping[str, Any]) -> JSON: ...

    async def replace_lease(self, name: str, lease: Mapping[str, Any]) -> JSON: ...


class AccessPort(Protocol):
    """What the controller's report on its own rights needs (`allocation_controller.rights`):
    a SelfSubjectAccessReview, which every authenticated identity may create, and an Event in
    the owner's namespace, which the tenant cannot take away."""

    async def review_access(self, review: Mapping[str, Any]) -> JSON:
        """Create the SelfSubjectAccessReview; returns it with its `status` answered."""

    async def create_owner_event(self, event: Mapping[str, Any]) -> None:
        """Create an events.k8s.io/v1 Event in the owner's namespace (the Lease's)."""


class KubePort(PodPort, ListWatch, LeasePort, ClaimReader, AccessPort, Protocol):
    """All of them, as one API server connection provides them."""
