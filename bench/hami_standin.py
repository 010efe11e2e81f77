"""What HAMi's device plugin does once per Pod on its node, for KWOK nodes that have none.

HAMi's extender binds a Pod only after taking a lock on its node (`hami.io/mutex.lock`), and
the lock is the handshake with the device plugin: the kubelet's `Allocate` does not say which
Pod it is for, so the plugin reads the Pod from the lock's owner, allocates, marks the Pod
`hami.io/bind-phase: success` and only then releases the lock (HAMi v2.10,
`pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go` `Allocate`, `plugin/util.go`,
`pkg/util/util.go` `GetAllocatePodByNode`, `pkg/util/nodelock/nodelock.go` `ReleaseNodeLock`).
With no device plugin the node stays locked for `--node-lock-timeout` (5 minutes).

`DevicePluginStandIn` watches HAMi's Pods and, `delay` seconds after the watch shows a Pod
bound with `bind-phase: allocating`, makes the plugin's own API calls for it, in its order:
GET the node (the lock names the Pod), GET the Pod, PATCH the Pod (the devices left to allocate,
none), GET the Pod, PATCH it `success`, GET the node twice and PATCH it without the lock (a
conflict retried as the plugin retries). On a real node the delay is the kubelet's: its watch
delivering the bind, its admission and the device manager's call; one timer per Pod, so nodes
stay independent as they are. It authenticates as a user of its own, so its requests count as
HAMi's (`peer_audit.py`).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hami_peer import BIND_PHASE, NODE_LOCK, TO_ALLOCATE

from localcluster import ApiError, ControlPlane

IDENTITY = "hami-device-plugin"
USER = "bench:hami-device-plugin"
# The kubelet's share between the bind and Allocate (its watch, admission, the device
# manager's call): 200 ms, which the earlier audit measured to cost HAMi about a fifth.
DEFAULT_DELAY = 0.2
LOCK_PATH = "/metadata/annotations/hami.io~1mutex.lock"


class DevicePluginStandIn:
    """The module docstring says what it does and why."""

    def __init__(
        self, plane: ControlPlane, namespaces: Collection[str], delay: float = DEFAULT_DELAY
    ) -> None:
        plane.add_identity(IDENTITY, USER, ("system:masters",))
        self.kube = plane.kube(IDENTITY)
        self.watch_kube = plane.kube("admin")
        self.namespaces = set(namespaces)
        self.delay = delay
        self.stopping = threading.Event()
        self.released = 0
        self.not_ours = 0
        self.errors: list[str] = []
        self._seen: set[str] = set()
        self._due: list[tuple[float, str, str, str]] = []
        self._pending = 0
        self._lock = threading.Condition()
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="standin")
        self._threads = [
            threading.Thread(target=self._watch, daemon=True),
            threading.Thread(target=self._timer, daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            self._lock.notify_all()
        for thread in self._threads:
            thread.join(timeout=10)
        self._pool.shutdown(wait=True)

    def idle(self, timeout: float = 10.0) -> bool:
        """Whether every Pod seen allocating has been handled, waiting up to `timeout`."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._due or self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.1))
        return True

    def _watch(self) -> None:
        path = "/api/v1/pods"
        version = self.watch_kube.request("GET", path, query={"limit": 1})["metadata"][
            "resourceVersion"
        ]
        while not self.stopping.is_set():
            try:
                for event in self.watch_kube.watch(path, {"resourceVersion": version}, timeout=5):
                    obj = event.get("object", {})
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._seen_bound(obj)
                    if self.stopping.is_set():
                        return
            except Exception as exc:  # a closed watch is resumed; anything else is recorded
                self.errors.append(repr(exc)[:300])
                if len(self.errors) > 50:
                    return

    def _seen_bound(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata", {})
        node = obj.get("spec", {}).get("nodeName")
        if meta.get("namespace") not in self.namespaces or not node:
            return
        if (meta.get("annotations") or {}).get(BIND_PHASE) != "allocating":
            return
        uid = str(meta.get("uid"))
        with self._lock:
            if uid in self._seen:
                return
            self._seen.add(uid)
            heapq.heappush(
                self._due, (time.monotonic() + self.delay, node, meta["namespace"], meta["name"])
            )
            self._lock.notify_all()

    def _timer(self) -> None:
        while not self.stopping.is_set():
            with self._lock:
                if not self._due:
                    self._lock.wait(0.5)
                    continue
                due, node, namespace, name = self._due[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._lock.wait(wait)
                    continue
                heapq.heappop(self._due)
                self._pending += 1
            self._pool.submit(self._allocate, node, namespace, name)

    def _allocate(self, node: str, namespace: str, name: str) -> None:
        try:
            self._calls(node, namespace, name)
        except ApiError as exc:
            # The Pod was deleted before its turn (the end of a run): a real node's kubelet
            # would not have called Allocate either.
            if exc.status != 404:
                self.errors.append(repr(exc)[:300])
        except Exception as exc:
            self.errors.append(repr(exc)[:300])
        finally:
            with self._lock:
                self._pending -= 1
                self._lock.notify_all()

    def _calls(self, node: str, namespace: str, name: str) -> None:
        kube = self.kube
        owner = (kube.get("v1", "Node", node)["metadata"].get("annotations") or {}).get(
            NODE_LOCK, ""
        )
        if not owner.endswith(f",{namespace},{name}"):
            # Allocate finds no Pod of its own on the node; the plugin fails it and the kubelet
            # retries later. Here nothing later comes, so count it.
            self.not_ours += 1
            return
        pod_path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        kube.request("GET", pod_path)
        merge = "application/merge-patch+json"
        kube.request(
            "PATCH",
            pod_path,
            body={"metadata": {"annotations": {TO_ALLOCATE: ""}}},
            content_type=merge,
        )
        kube.request("GET", pod_path)
        kube.request(
            "PATCH",
            pod_path,
            body={"metadata": {"annotations": {BIND_PHASE: "success"}}},
            content_type=merge,
        )
        kube.get("v1", "Node", node)
        for _ in range(5):
            current = kube.get("v1", "Node", node)["metadata"]
            held = (current.get("annotations") or {}).get(NODE_LOCK, "")
            if not held.endswith(f",{namespace},{name}"):
                return
            try:
                kube.request(
                    "PATCH",
                    f"/api/v1/nodes/{node}",
                    body={
                        "metadata": {
                            "annotations": {NODE_LOCK: None},
                            "resourceVersion": current["resourceVersion"],
                        }
                    },
                    content_type=merge,
                )
                self.released += 1
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise


__all__ = ["DEFAULT_DELAY", "IDENTITY", "USER", "DevicePluginStandIn"]
