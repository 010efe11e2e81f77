"""The ports over the real API server, with aiohttp.

The official client is synchronous; at 100 Pods a second a thread per call would spend more on
thread hand-offs than on the calls, and a watch would pin a thread each. So the requests are made
here on the event loop, and the official client is used for what it is good at: reading a
kubeconfig or the in-cluster service account (CA, client certificate, bearer token, and the
token's periodic re-read) into a `Configuration` (`serving.kube`, as for the other servers),
whose token is asked for on every request.

Every request has a timeout (`timeout`, kept below the leader election margin by the settings),
watches excepted: a watch is bounded by its `timeoutSeconds` plus a read timeout instead. A watch
stream is read in chunks and split on newlines here, because aiohttp's line reader refuses lines
longer than its buffer and a Pod with a large request annotation is one long line.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from allocation_controller.ports import JSON, NotFound, Resource, WatchEvent, api_error
from serving.kube import load_configuration

MAX_LINE_BYTES = 32 * 1024 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
CONTENT_TYPES = {
    "json": "application/json",
    "strategic": "application/strategic-merge-patch+json",
}


def ssl_context(configuration: Any) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class HttpKube:
    """All three ports for one namespace over one connection pool."""

    def __init__(
        self,
        server: str,
        namespace: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        authorization: Callable[[], str | None] | None = None,
        timeout: float = 4.0,
        connections: int = 32,
    ) -> None:
        self.server = server.rstrip("/")
        self._namespace = namespace
        self._ssl = ssl_context
        self._authorization = authorization or (lambda: None)
        self.timeout = timeout
        self.connections = connections
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_kubeconfig(
        cls, kubeconfig: str | None, namespace: str, *, timeout: float = 4.0
    ) -> HttpKube:
        configuration = load_configuration(kubeconfig)
        context = ssl_context(configuration) if configuration.host.startswith("https") else None
        return cls(
            configuration.host,
            namespace,
            ssl_context=context,
            # The client files a kubeconfig or service-account token under "BearerToken".
            authorization=lambda: configuration.get_api_key_with_prefix(
                "BearerToken", alias="authorization"
            ),
            timeout=timeout,
        )

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                ssl=self._ssl if self._ssl is not None else False, limit=self.connections
            )
            self._session = aiohttp.ClientSession(
                connector=connector, json_serialize=lambda v: orjson.dumps(v).decode()
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self._authorization()
        if token:
            headers["Authorization"] = token
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _path(self, resource: str, name: str | None = None, group: str = "") -> str:
        base = f"/apis/{group}" if group else "/api/v1"
        path = f"{base}/namespaces/{quote(self._namespace, safe='')}/{resource}"
        return path + (f"/{quote(name, safe='')}" if name else "")

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = CONTENT_TYPES["json"],
    ) -> Any:
        """One request; the decoded JSON answer, or the ApiError its Status describes."""
        data = orjson.dumps(body) if body is not None else None
        async with self.session.request(
            method,
            self.server + path,
            params=params,
            data=data,
            headers=self._headers(content_type if data is not None else None),
            timeout=aiohttp.ClientTimeout(total=self.timeout),
        ) as response:
            body_bytes = bytearray()
            async for chunk in response.content.iter_any():
                body_bytes.extend(chunk)
                if len(body_bytes) > MAX_BODY_BYTES:
                    raise api_error(response.status, "TooLarge", f"{path}: answer too large")
            raw = bytes(body_bytes)
            if response.status >= 400:
                raise _status_error(response.status, raw)
            return orjson.loads(raw) if raw else None

    # -- PodPort -------------------------------------------------------------------------------

    async def get_pod(self, name: str, *, fresh: bool = False) -> JSON | None:
        try:
            pod: JSON = await self.request("GET", self._path("pods", name))
        except NotFound:
            return None
        return pod

    async def list_pods(self, label_selector: str) -> list[JSON]:
        items, _ = await self.list_objects("pods", label_selector=label_selector)
        return items

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

    # -- WatchPort -----------------------------------------------------------------------------

    async def list_objects(
        self,
        resource: Resource,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[JSON], str]:
        params = _selectors(label_selector, field_selector)
        document = await self.request("GET", self._path(resource), params=params)
        kind = "Pod" if resource == "pods" else "ConfigMap"
        items: list[JSON] = []
        for item in document.get("items") or []:
            # Items of a List come without kind and apiVersion; callers expect whole objects.
            item.setdefault("apiVersion", "v1")
            item.setdefault("kind", kind)
            items.append(item)
        return items, str((document.get("metadata") or {}).get("resourceVersion") or "")

    async def watch_objects(
        self,
        resource: Resource,
        *,
        resource_version: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        params = _selectors(label_selector, field_selector)
        params.update(
            {
                "watch": "true",
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(timeout_seconds),
            }
        )
        if resource_version:
            params["resourceVersion"] = resource_version
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.timeout, sock_read=timeout_seconds + 30
        )
        async with self.session.get(
            self.server + self._path(resource),
            params=params,
            headers=self._headers(),
            timeout=timeout,
        ) as response:
            if response.status >= 400:
                raise _status_error(response.status, await response.read())
            buffer = bytearray()
            async for chunk in response.content.iter_any():
                buffer.extend(chunk)
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if line.strip():
                        yield _watch_event(line)
                if len(buffer) > MAX_LINE_BYTES:
                    raise api_error(500, "TooLarge", "a watch event is larger than allowed")

    # -- LeasePort -----------------------------------------------------------------------------

    _LEASES = "coordination.k8s.io/v1"

    async def get_lease(self, name: str) -> JSON | None:
        try:
            lease: JSON = await self.request("GET", self._path("leases", name, self._LEASES))
        except NotFound:
            return None
        return lease

    async def create_lease(self, lease: Mapping[str, Any]) -> JSON:
        created: JSON = await self.request(
            "POST", self._path("leases", group=self._LEASES), body=dict(lease)
        )
        return created

    async def replace_lease(self, name: str, lease: Mapping[str, Any]) -> JSON:
        replaced: JSON = await self.request(
            "PUT", self._path("leases", name, self._LEASES), body=dict(lease)
        )
        return replaced


def _selectors(label_selector: str | None, field_selector: str | None) -> dict[str, str]:
    params: dict[str, str] = {}
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params


def _status_error(status: int, raw: bytes) -> Exception:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        return api_error(status, str(body.get("reason", "")), str(body.get("message", "")))
    return api_error(status, "", raw[:200].decode("utf-8", "replace"))


def _watch_event(line: bytes) -> WatchEvent:
    document = orjson.loads(line)
    kind = document.get("type")
    obj = document.get("object") or {}
    if kind == "ERROR":
        raise api_error(
            int(obj.get("code") or 500), str(obj.get("reason", "")), str(obj.get("message", ""))
        )
    return WatchEvent(str(kind), obj)
