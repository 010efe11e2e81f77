"""The controller's ports over the real API server: its namespace's Pods and Events, its Lease,
and what it asks about its own rights.

List and watch, the connection pool and the credentials are `serving.apiserver.ApiClient`'s,
shared with the other servers; what is added here is what only the controller writes. Every
request has a timeout (`timeout`, kept below the leader election margin by the settings).
A process serving several tenant namespaces (`allocation_controller.fleet`) has one port per
namespace, all over the first one's connection pool (`beside`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from allocation_controller.ports import JSON, NotFound
from serving.apiserver import CONTENT_TYPES, ApiClient
from serving.informer import Collection, list_all


class HttpKube(ApiClient):
    """All three ports for one namespace over one connection pool; the Lease may live in
    another (the owner's), out of the tenant's reach."""

    def __init__(
        self, server: str, namespace: str, lease_namespace: str | None = None, **options: Any
    ) -> None:
        super().__init__(server, **options)
        self._namespace = namespace
        self._lease_namespace = lease_namespace or namespace
        # The port whose connection pool this one uses (`beside`); None: its own.
        self._pool: HttpKube | None = None

    @classmethod
    def from_kubeconfig(
        cls,
        kubeconfig: str | None,
        namespace: str,
        *,
        lease_namespace: str | None = None,
        timeout: float = 4.0,
    ) -> HttpKube:
        options = ApiClient.options(kubeconfig)
        return cls(
            options.pop("server"),
            namespace,
            lease_namespace,
            timeout=timeout,
            **options,
        )

    def beside(self, namespace: str) -> HttpKube:
        """A port for another tenant namespace over this one's API server, credentials,
        connection pool and Lease namespace; closing it leaves the pool to this one."""
        other = HttpKube(
            self.server,
            namespace,
            self._lease_namespace,
            ssl_context=self._ssl,
            authorization=self._authorization,
            timeout=self.timeout,
            connections=self.connections,
        )
        other._pool = self._pool or self
        return other

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._pool is not None:
            return self._pool.session
        return super().session

    @property
    def watch_session(self) -> aiohttp.ClientSession:
        if self._pool is not None:
            return self._pool.watch_session
        return super().watch_session

    async def close(self) -> None:
        if self._pool is None:
            await super().close()

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def lease_namespace(self) -> str:
        return self._lease_namespace

    def _path(
        self, resource: str, name: str | None = None, group: str = "", namespace: str = ""
    ) -> str:
        base = f"/apis/{group}" if group else "/api/v1"
        path = f"{base}/namespaces/{quote(namespace or self._namespace, safe='')}/{resource}"
        return path + (f"/{quote(name, safe='')}" if name else "")

    def _lease(self, name: str | None = None) -> str:
        return self._path("leases", name, self._LEASES, self._lease_namespace)

    # -- PodPort -------------------------------------------------------------------------------

    async def get_pod(self, name: str, *, fresh: bool = False) -> JSON | None:
        try:
            pod: JSON = await self.request("GET", self._path("pods", name))
        except NotFound:
            return None
        return pod

    # -- ClaimReader -----------------------------------------------------------------------------

    async def get_resource_claim(self, name: str) -> JSON | None:
        try:
            claim: JSON = await self.request(
                "GET", self._path("resourceclaims", name, "resource.k8s.io/v1")
            )
        except NotFound:
            return None
        return claim

    async def list_resource_slices(self, node: str) -> list[JSON]:
        # Node-local devices only: the allocated device is on the Pod's node.
        selector = quote(f"spec.nodeName={node}", safe="")
        body: JSON = await self.request(
            "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector={selector}"
        )
        items = body.get("items")
        return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []

    async def list_pods(self, label_selector: str) -> list[JSON]:
        pods = Collection("pods", "Pod", self._namespace, label_selector=label_selector)
        return (await list_all(self, pods)).items

    async def patch_pod_status(self, name: str, patch: Mapping[str, Any]) -> JSON:
        pod: JSON = await self.request(
            "PATCH",
            self._path("pods", name) + "/status",
            body=dict(patch),
            content_type=CONTENT_TYPES["strategic"],
        )
        return pod

    async def create_event(self, event: Mapping[str, Any]) -> None:
        await self.request("POST", self._path("events", group="events.k8s.io/v1"), body=event)

    # -- AccessPort ----------------------------------------------------------------------------

    async def review_access(self, review: Mapping[str, Any]) -> JSON:
        answered: JSON = await self.request(
            "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=dict(review)
        )
        return answered

    async def create_owner_event(self, event: Mapping[str, Any]) -> None:
        path = self._path("events", group="events.k8s.io/v1", namespace=self._lease_namespace)
        await self.request("POST", path, body=dict(event))

    # -- LeasePort -----------------------------------------------------------------------------

    _LEASES = "coordination.k8s.io/v1"

    async def get_lease(self, name: str) -> JSON | None:
        try:
            lease: JSON = await self.request("GET", self._lease(name))
        except NotFound:
            return None
        return lease

    async def create_lease(self, lease: Mapping[str, Any]) -> JSON:
        created: JSON = await self.request("POST", self._lease(), body=dict(lease))
        return created

    async def replace_lease(self, name: str, lease: Mapping[str, Any]) -> JSON:
        replaced: JSON = await self.request("PUT", self._lease(name), body=dict(lease))
        return replaced
