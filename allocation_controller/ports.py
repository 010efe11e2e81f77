"""The controller's view of the API server: three small ports and the errors they raise.

The reconcile logic, the informers and the leader elector each talk to the API server only
through these protocols, so the same code runs against the real API server (`kubeapi.HttpKube`)
and against the in-memory fake (`memory.MemoryKube`) that the tests and the benchmark use.
Objects cross the ports as plain JSON dicts, as the API server sends them: the controller reads
a handful of fields and writes small patches, so typed models would only add a translation step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

JSON = dict[str, Any]
Resource = Literal["pods", "configmaps"]


class ApiError(Exception):
    """A non-2xx answer, with the HTTP status and the `Status` reason and message."""

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        super().__init__(f"HTTP {status} {reason}: {message}".strip())
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(ApiError):
    """404: the object does not exist (any more)."""


class Conflict(ApiError):
    """409: the object changed since it was read, or already exists."""


class Gone(ApiError):
    """410: the resourceVersion a watch asked for is older than the API server keeps."""


def api_error(status: int, reason: str = "", message: str = "") -> ApiError:
    """The most specific ApiError for a status code."""
    kind = {404: NotFound, 409: Conflict, 410: Gone}.get(status, ApiError)
    return kind(status, reason, message)


@dataclass(frozen=True)
class WatchEvent:
    """One line of a watch stream: ADDED, MODIFIED, DELETED or BOOKMARK, and the object."""

    type: str
    object: JSON


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


class WatchPort(Protocol):
    """What an informer needs: a consistent list, then a watch from its resourceVersion."""

    async def list_objects(
        self,
        resource: Resource,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[JSON], str]:
        """The matching objects and the list's resourceVersion."""

    def watch_objects(
        self,
        resource: Resource,
        *,
        resource_version: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        """Changes after `resource_version`; raises Gone if that version is no longer kept."""


class LeasePort(Protocol):
    """What the leader elector needs: a coordination.k8s.io/v1 Lease, read and written with
    optimistic concurrency (a stale resourceVersion is a Conflict)."""

    async def get_lease(self, name: str) -> JSON | None: ...

    async def create_lease(self, lease: Mapping[str, Any]) -> JSON: ...

    async def replace_lease(self, name: str, lease: Mapping[str, Any]) -> JSON: ...


class KubePort(PodPort, WatchPort, LeasePort, Protocol):
    """All three, as one API server connection provides them."""
