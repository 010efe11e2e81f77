"""A fake API server for ConfigMaps: list and watch by name, enough for the webhook's source.

It speaks the wire protocol the official client uses (a List with `metadata.resourceVersion`,
then a watch stream of JSON lines that ends after `timeoutSeconds`), so `KubernetesSource` runs
unmodified against it, threads, client and all. Tests change ConfigMaps with `put`/`delete`,
which bump the resource version and notify open watches, and can make the next requests fail.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web


class FakeApiServer:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 100
        self.watchers: list[tuple[str, asyncio.Queue[dict[str, Any]]]] = []
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.fail_next = 0
        self.forbidden: set[str] = set()
        self.gone_next = 0
        self.lists = 0
        self.watches = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{namespace}/configmaps", self._configmaps)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        for _, queue in self.watchers:
            queue.put_nowait({"type": "CLOSE"})
        if self.runner is not None:
            await self.runner.cleanup()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "webhook", "user": {"token": "test-token"}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": "webhook"}}
                    ],
                    "current-context": "fake",
                }
            )
        )
        return path

    def _bump(self) -> str:
        self.version += 1
        return str(self.version)

    def put(self, configmap: dict[str, Any]) -> None:
        obj = copy.deepcopy(configmap)
        name = obj["metadata"]["name"]
        existing = self.objects.get(name)
        obj["metadata"]["namespace"] = self.namespace
        obj["metadata"]["uid"] = existing["metadata"]["uid"] if existing else str(uuid.uuid4())
        obj["metadata"]["resourceVersion"] = self._bump()
        self.objects[name] = obj
        self._notify(name, "MODIFIED" if existing else "ADDED", obj)

    def delete(self, name: str) -> None:
        obj = self.objects.pop(name)
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = self._bump()
        self._notify(name, "DELETED", obj)

    def _notify(self, name: str, kind: str, obj: dict[str, Any]) -> None:
        event = {"type": kind, "object": obj}
        self.history.append((self.version, name, event))
        for watched, queue in self.watchers:
            if watched == name:
                queue.put_nowait(event)

    async def _configmaps(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != "Bearer test-token":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        if self.fail_next > 0:
            self.fail_next -= 1
            return web.json_response(
                {"kind": "Status", "status": "Failure", "code": 500, "message": "boom"},
                status=500,
            )
        selector = request.query.get("fieldSelector", "")
        if not selector.startswith("metadata.name="):
            return web.json_response({"kind": "Status", "code": 403}, status=403)
        name = selector.removeprefix("metadata.name=")
        if name in self.forbidden:
            # What RBAC answers when the Role's resourceNames do not include the name.
            return web.json_response(
                {"kind": "Status", "status": "Failure", "code": 403, "reason": "Forbidden"},
                status=403,
            )
        if request.query.get("watch") in ("true", "1", "True"):
            return await self._watch(request, name)
        self.lists += 1
        items = []
        if name in self.objects:
            item = copy.deepcopy(self.objects[name])
            # Items of a List carry no kind or apiVersion on the wire.
            item.pop("kind", None)
            item.pop("apiVersion", None)
            items.append(item)
        return web.json_response(
            {
                "kind": "ConfigMapList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.version)},
                "items": items,
            }
        )

    async def _watch(self, request: web.Request, name: str) -> web.StreamResponse:
        self.watches += 1
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        if self.gone_next > 0:
            self.gone_next -= 1
            gone = {
                "type": "ERROR",
                "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "old"},
            }
            await response.write(json.dumps(gone).encode() + b"\n")
            return response
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        # Like the real server: replay what happened after the version the client listed at.
        since = int(request.query.get("resourceVersion") or self.version)
        for version, watched, event in self.history:
            if watched == name and version > since:
                queue.put_nowait(event)
        entry = (name, queue)
        self.watchers.append(entry)
        timeout = float(request.query.get("timeoutSeconds", "30"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while (left := deadline - loop.time()) > 0:
                try:
                    event = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if event["type"] == "CLOSE":
                    break
                await response.write(json.dumps(event).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.watchers.remove(entry)
        return response
