"""Plain-JSON access to the API server for the harness and the e2e tests.

The generated ``kubernetes`` client models every kind as a typed object and knows no
custom resources; tests mostly want to send a dict exactly as written (including
deliberately odd shapes the guard must refuse) and read the raw ``Status`` of a
denial. This module does that over the configured ``ApiClient``'s connection pool:
arbitrary requests, kind-to-resource discovery, and server-side apply of any kind.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, urlencode

import urllib3
import yaml
from kubernetes import client as k8s

JSON = dict[str, Any]
Manifest = str | os.PathLike[str] | Mapping[str, Any] | Sequence[Mapping[str, Any]]

APPLY_FIELD_MANAGER = "tmi-localcluster"


class ApiError(RuntimeError):
    """A non-2xx answer from the API server, with its decoded ``Status`` body."""

    def __init__(self, method: str, path: str, status: int, body: JSON | str) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.body = body
        self.reason = body.get("reason", "") if isinstance(body, dict) else ""
        self.message = body.get("message", "") if isinstance(body, dict) else str(body)
        super().__init__(f"{method} {path}: HTTP {status} {self.reason}: {self.message}")


@dataclass(frozen=True)
class ResourceInfo:
    group_version: str
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        if self.namespaced:
            if namespace is None:
                raise ValueError(f"{self.kind} is namespaced; a namespace is required")
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name, safe='')}"
        return base


def load_documents(source: Manifest) -> list[JSON]:
    """Parse a manifest source into a list of objects (empty documents dropped).

    ``source`` may be a path to a file, a path to a directory (its *.yaml / *.yml /
    *.json files in name order), YAML text, one object, or a list of objects. A
    ``str`` is read as a path only when such a file or directory exists.
    """
    texts: list[str] = []
    if isinstance(source, Mapping):
        return [dict(source)]
    if isinstance(source, Sequence) and not isinstance(source, str):
        return [dict(doc) for doc in source]
    path = Path(source)
    if isinstance(source, os.PathLike) or (
        "\n" not in source and len(source) < 4096 and path.exists()
    ):
        if path.is_dir():
            files = sorted(
                p for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file()
            )
            texts = [p.read_text() for p in files]
        else:
            texts = [path.read_text()]
    else:
        texts = [str(source)]
    docs: list[JSON] = []
    for text in texts:
        for doc in yaml.safe_load_all(text):
            if doc is None:
                continue
            if not isinstance(doc, dict):
                raise ValueError(f"manifest document is not a mapping: {doc!r:.80}")
            if doc.get("kind", "").endswith("List") and "items" in doc:
                docs.extend(cast(list[JSON], doc["items"]))
            else:
                docs.append(doc)
    return docs


class Kube:
    """Raw JSON requests with the credentials of one ``ApiClient``."""

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self.api_client = api_client
        self._host = cast(str, api_client.configuration.host).rstrip("/")
        self._discovery: dict[str, list[ResourceInfo]] = {}

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str | int | bool] | Iterable[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> JSON:
        """Send one request; return the decoded JSON body or raise ApiError."""
        url = self._host + path
        if query:
            items = query.items() if isinstance(query, Mapping) else query
            pairs = [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in items]
            url += "?" + urlencode(pairs)
        headers = {"Accept": "application/json", "Content-Type": content_type}
        # A token identity (a ServiceAccount's) authenticates by header; a certificate one by
        # the pool's TLS setup.
        token = self.api_client.configuration.get_api_key_with_prefix("authorization")
        if token:
            headers["Authorization"] = token
        payload: bytes | None
        if body is None:
            payload = None
        elif isinstance(body, bytes):
            payload = body
        elif isinstance(body, str):
            payload = body.encode()
        else:
            payload = json.dumps(body).encode()
        # The client's connection pool carries the TLS and client-certificate setup;
        # its request() reshapes bodies by content type, so bypass that layer.
        pool = self.api_client.rest_client.pool_manager
        resp = pool.request(
            method,
            url,
            body=payload,
            headers=headers,
            timeout=urllib3.Timeout(total=timeout),
            retries=False,
        )
        text = resp.data.decode("utf-8", "replace")
        try:
            decoded: Any = json.loads(text) if text else {}
        except ValueError:
            decoded = text
        if not 200 <= resp.status < 300:
            raise ApiError(method, path, resp.status, decoded)
        return decoded if isinstance(decoded, dict) else {"raw": decoded}

    def watch(
        self, path: str, query: Mapping[str, str | int | bool], *, timeout: float = 300.0
    ) -> Iterator[JSON]:
        """The events of a watch on `path` (with `watch=true` and `timeoutSeconds` added), each
        decoded, until the server ends the stream or the caller stops iterating."""
        pairs = {
            str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in query.items()
        }
        pairs.update({"watch": "true", "timeoutSeconds": str(int(timeout))})
        response = self.api_client.rest_client.pool_manager.request(
            "GET",
            f"{self._host}{path}?{urlencode(pairs)}",
            headers={"Accept": "application/json"},
            preload_content=False,
            timeout=urllib3.Timeout(connect=10.0, read=timeout + 10.0),
            retries=False,
        )
        ended = False
        try:
            if not 200 <= response.status < 300:
                raise ApiError("GET", path, response.status, response.read().decode())
            buffer = b""
            for chunk in response.stream(65536):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
            ended = True
        finally:
            # A stream the caller left early still has the server's bytes coming: only a
            # stream that ended may go back to the pool; the rest is closed, not leaked.
            if not ended:
                response.close()
            response.release_conn()

    # -- discovery -------------------------------------------------------------

    def _resources(self, group_version: str, refresh: bool = False) -> list[ResourceInfo]:
        if refresh or group_version not in self._discovery:
            path = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
            try:
                doc = self.request("GET", path)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                doc = {"resources": []}
            self._discovery[group_version] = [
                ResourceInfo(group_version, r["kind"], r["name"], bool(r["namespaced"]))
                for r in doc.get("resources", [])
                if "/" not in r["name"]
            ]
        return self._discovery[group_version]

    def resource_for(self, api_version: str, kind: str, wait: float = 30.0) -> ResourceInfo:
        """Map apiVersion/kind to its REST resource, waiting for new CRDs to be served."""
        deadline = time.monotonic() + wait
        refresh = False
        while True:
            for info in self._resources(api_version, refresh=refresh):
                if info.kind == kind:
                    return info
            if time.monotonic() >= deadline:
                raise LookupError(f"the API server serves no {kind} in {api_version}")
            refresh = True
            time.sleep(0.5)

    def path_for(self, obj: Mapping[str, Any], namespace: str | None = None) -> str:
        info = self.resource_for(obj["apiVersion"], obj["kind"])
        meta = obj.get("metadata", {})
        ns = (meta.get("namespace") or namespace) if info.namespaced else None
        return info.path(ns, meta["name"])

    # -- object helpers --------------------------------------------------------

    def apply(
        self,
        obj: Mapping[str, Any],
        *,
        namespace: str | None = None,
        field_manager: str = APPLY_FIELD_MANAGER,
        force: bool = True,
        dry_run: bool = False,
    ) -> JSON:
        """Server-side apply one object of any kind."""
        info = self.resource_for(obj["apiVersion"], obj["kind"])
        body = dict(obj)
        meta = dict(body.get("metadata", {}))
        if info.namespaced:
            meta.setdefault("namespace", namespace or "default")
        body["metadata"] = meta
        query: dict[str, str | int | bool] = {"fieldManager": field_manager, "force": force}
        if dry_run:
            query["dryRun"] = "All"
        return self.request(
            "PATCH",
            info.path(meta.get("namespace"), meta["name"]),
            body=body,
            query=query,
            content_type="application/apply-patch+yaml",
        )

    def create(
        self, obj: Mapping[str, Any], *, namespace: str | None = None, dry_run: bool = False
    ) -> JSON:
        info = self.resource_for(obj["apiVersion"], obj["kind"])
        ns = obj.get("metadata", {}).get("namespace") or namespace
        query = {"dryRun": "All"} if dry_run else None
        return self.request(
            "POST", info.path(ns if info.namespaced else None), body=dict(obj), query=query
        )

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> JSON:
        info = self.resource_for(api_version, kind)
        return self.request("GET", info.path(namespace if info.namespaced else None, name))

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = 0,
        missing_ok: bool = True,
    ) -> None:
        info = self.resource_for(api_version, kind)
        query = (
            {"gracePeriodSeconds": grace_period_seconds}
            if grace_period_seconds is not None
            else None
        )
        try:
            self.request(
                "DELETE", info.path(namespace if info.namespaced else None, name), query=query
            )
        except ApiError as exc:
            if not (missing_ok and exc.status == 404):
                raise

    def patch_status(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None,
        patch: Mapping[str, Any],
    ) -> JSON:
        """Strategic-merge patch of the status subresource (conditions merge by type)."""
        info = self.resource_for(api_version, kind)
        return self.request(
            "PATCH",
            info.path(namespace if info.namespaced else None, name) + "/status",
            body=dict(patch),
            content_type="application/strategic-merge-patch+json",
        )

    def wait_for(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None,
        predicate: Callable[[JSON], bool],
        *,
        timeout: float = 60.0,
        what: str = "",
    ) -> JSON:
        """Poll an object until ``predicate`` holds; return it. Missing objects keep polling.

        On timeout the error shows the object's last state, which is usually what
        explains the failure (conditions, phase, nodeName).
        """
        deadline = time.monotonic() + timeout
        interval = 0.1
        last: JSON | None = None
        last_error: ApiError | None = None
        while True:
            try:
                last = self.get(api_version, kind, name, namespace)
                last_error = None
                if predicate(last):
                    return last
            except ApiError as exc:
                if exc.status != 404:
                    raise
                last_error = exc
            if time.monotonic() >= deadline:
                state = (
                    json.dumps(last.get("status", last), indent=1)[:3000] if last else last_error
                )
                label = what or f"{kind} {namespace + '/' if namespace else ''}{name}"
                raise TimeoutError(
                    f"timed out after {timeout:.0f}s waiting for {label}; last: {state}"
                )
            time.sleep(interval)
            interval = min(interval * 1.5, 1.0)


def pod_condition(pod: Mapping[str, Any], condition_type: str) -> str | None:
    """The status ("True"/"False"/"Unknown") of a pod condition, or None when absent."""
    for cond in pod.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == condition_type:
            return cast(str, cond.get("status"))
    return None
