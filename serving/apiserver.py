"""The API server over aiohttp: one connection pool, the loaded credentials, JSON requests, list
pages and watch streams.

The official client is synchronous: a watch would pin a thread each, and stopping a server would
have to wait for a blocked read or abandon it. So requests are made here on the event loop, and
the credentials are read once (`serving.credentials`: a kubeconfig or the in-cluster service
account: CA, client certificate, bearer token, and the token's periodic re-read), the token
asked for on every request.

Every request has a timeout, watches excepted: a watch is bounded by its `timeoutSeconds` plus a
read timeout instead. A watch stream is read in chunks and split on newlines here, because
aiohttp's line reader refuses lines longer than its buffer and a Pod with a large request
annotation is one long line. `ApiClient` is the informer's `ListWatch`; the controller adds its
writes on top of it.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import orjson

from inference_policy.base.pod_view import ObjectView
from serving.credentials import load_credentials
from serving.informer import Collection, Page, WatchEvent
from serving.kube import ClientConfigError, api_error

MAX_LINE_BYTES = 32 * 1024 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
# A watch that says nothing for this long past its own timeout is a dead connection.
WATCH_READ_GRACE = 30
CONTENT_TYPES = {
    "json": "application/json",
    "strategic": "application/strategic-merge-patch+json",
}


class ApiClient:
    """Requests to one API server over one connection pool, made on the running loop."""

    def __init__(
        self,
        server: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        authorization: Callable[[], str | None] | None = None,
        timeout: float = 30.0,
        connections: int = 32,
    ) -> None:
        self.server = server.rstrip("/")
        self._ssl = ssl_context
        self._authorization = authorization or (lambda: None)
        self.timeout = timeout
        self.connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._watch_session: aiohttp.ClientSession | None = None

    @staticmethod
    def options(kubeconfig: str | None) -> dict[str, Any]:
        """The constructor's arguments from a kubeconfig (None: the in-cluster account); loaded
        now, so a bad kubeconfig fails the start (ClientConfigError), not a later request."""
        credentials = load_credentials(kubeconfig)
        try:
            context = credentials.ssl_context()
        except (OSError, ssl.SSLError) as exc:
            raise ClientConfigError(
                f"cannot load the Kubernetes client configuration from "
                f"{kubeconfig or 'the in-cluster service account'}: its TLS files: {exc}"
            ) from None
        return {
            "server": credentials.server,
            "ssl_context": context,
            "authorization": credentials.authorization,
        }

    @property
    def session(self) -> aiohttp.ClientSession:
        # Made on first use, so on the loop that uses it.
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                ssl=self._ssl if self._ssl is not None else False, limit=self.connections
            )
            self._session = aiohttp.ClientSession(
                connector=connector, json_serialize=lambda v: orjson.dumps(v).decode()
            )
        return self._session

    @property
    def watch_session(self) -> aiohttp.ClientSession:
        """The watches' own pool, without a limit: each watch holds its connection for as long
        as it runs, and a server watches one collection per tenant namespace and more, so in
        the requests' pool (`connections`) enough tenants' watches would leave no connection
        for a list, a write or a review, and the server would never get ready."""
        if self._watch_session is None or self._watch_session.closed:
            connector = aiohttp.TCPConnector(
                ssl=self._ssl if self._ssl is not None else False, limit=0
            )
            self._watch_session = aiohttp.ClientSession(connector=connector)
        return self._watch_session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._watch_session is not None:
            await self._watch_session.close()

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self._authorization()
        if token:
            headers["Authorization"] = token
        if content_type:
            headers["Content-Type"] = content_type
        return headers

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
                raise status_error(response.status, raw)
            return orjson.loads(raw) if raw else None

    # -- ListWatch -----------------------------------------------------------------------------

    async def list_page(
        self, collection: Collection, *, limit: int, continue_token: str | None = None
    ) -> Page:
        params = collection.params()
        params["limit"] = str(limit)
        if continue_token:
            params["continue"] = continue_token
        document = await self.request("GET", collection.path, params=params)
        if not isinstance(document, dict) or not isinstance(document.get("items", []), list):
            raise api_error(500, "BadList", f"the {collection} list is not a List")
        listed = ObjectView(document)
        items = [item for item in document.get("items") or [] if isinstance(item, dict)]
        return Page(
            items,
            listed.resource_version or "",
            str(listed.metadata.get("continue") or "") or None,
        )

    async def watch(
        self, collection: Collection, *, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[WatchEvent]:
        params = collection.params()
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
            total=None, sock_connect=self.timeout, sock_read=timeout_seconds + WATCH_READ_GRACE
        )
        async with self.watch_session.get(
            self.server + collection.path,
            params=params,
            headers=self._headers(),
            timeout=timeout,
        ) as response:
            if response.status >= 400:
                raise status_error(response.status, await response.read())
            # The start of an event whose line has not ended yet, in the pieces it came in:
            # a chunk carries many small events or a piece of a large one, and neither is
            # copied more than once.
            pending: list[bytes] = []
            size = 0
            async for chunk in response.content.iter_any():
                pending.append(chunk)
                if b"\n" not in chunk:
                    size += len(chunk)
                else:
                    *lines, rest = b"".join(pending).split(b"\n")
                    pending = [rest]
                    size = len(rest)
                    for line in lines:
                        if line.strip():
                            yield watch_event(line)
                if size > MAX_LINE_BYTES:
                    raise api_error(500, "TooLarge", "a watch event is larger than allowed")


def from_kubeconfig(kubeconfig: str | None, *, timeout: float = 30.0) -> ApiClient:
    """A client for the kubeconfig's API server (None: the in-cluster account's)."""
    return ApiClient(**ApiClient.options(kubeconfig), timeout=timeout)


def status_error(status: int, raw: bytes) -> Exception:
    """The ApiError for an error answer, with the reason and message of its Status if any."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        return api_error(status, str(body.get("reason", "")), str(body.get("message", "")))
    return api_error(status, "", raw[:200].decode("utf-8", "replace"))


def watch_event(line: bytes) -> WatchEvent:
    document = orjson.loads(line)
    if not isinstance(document, dict):
        raise api_error(500, "BadWatchEvent", "a watch line is not an object")
    obj = document.get("object")
    return WatchEvent(str(document.get("type")), obj if isinstance(obj, dict) else {})
