"""Where the extender's `ClusterView` comes from: Nodes, planned Pods and the profile ConfigMap.

`KubernetesSource` runs one informer per collection (all Nodes; the Pods labelled
`kamiwaza.ai/deployment-id` in each accounted namespace; the profile ConfigMap by name in the
tenant namespace). Each informer is a daemon thread that lists, then watches from the list's
resource version, and re-lists after `resync_seconds`, after a 410 Gone, or after an error
(with jittered backoff). The thread does the parsing and hands finished values to the event
loop with `call_soon_threadsafe`, so the view is only ever touched by the loop and a slow or
unreachable API server delays the next update but never a scheduling request.

After a restart, the first list of Pods rebuilds the whole ledger: nothing is persisted, and
nothing needs to be, because every accounted fact is in the API.

`MemorySource` feeds the same view from dicts, for tests and benchmarks.

The profile informer reads one named ConfigMap, as the webhook's source does, and the view
verifies it once per revision with the same `PolicyState`; the client configuration, list items,
error descriptions and retry delays are `serving.kube`'s. The two read loops stay apart: the
webhook's watches a few ConfigMaps by name and turns a forbidden read into a profile that did
not arrive, where these informers follow whole collections with periodic re-lists.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import kubernetes.watch.watch
import orjson

from extender.config import ALL_NAMESPACES
from extender.view import ClusterView
from inference_policy.ledger import accounted_pod, pod_key
from inference_policy.nodes import NodeFacts, node_facts
from inference_policy.wire import ENGINE_LABEL as DEPLOYMENT_LABEL
from serving.kube import Backoff, as_configmap, describe_error, kubernetes_api

log = logging.getLogger(__name__)
# The official client is only partly typed; it is used through this one untyped handle.
_kube: Any = kubernetes

Accounted = tuple[str, dict[str, int]] | None
Deliver = Callable[[Callable[[], None]], None]


class ClusterSource(Protocol):
    """Something that keeps a view current until stopped."""

    async def start(self, view: ClusterView) -> None: ...

    async def stop(self) -> None: ...


# -- in memory ----------------------------------------------------------------------------------


def _in_scope(pod: Mapping[str, Any], scopes: tuple[str, ...]) -> bool:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if DEPLOYMENT_LABEL not in labels:
        return False
    return ALL_NAMESPACES in scopes or meta.get("namespace") in scopes


class MemorySource:
    """Nodes, Pods and the profile from memory; `put_*`/`delete_*` act as watch events."""

    def __init__(
        self,
        nodes: Iterable[Mapping[str, Any]] = (),
        pods: Iterable[Mapping[str, Any]] = (),
        configmap: Mapping[str, Any] | None = None,
    ) -> None:
        self.nodes: dict[str, Mapping[str, Any]] = {str(n["metadata"]["name"]): n for n in nodes}
        self.pods: dict[str, Mapping[str, Any]] = {pod_key(p): p for p in pods}
        self.configmap = configmap
        self.view: ClusterView | None = None
        self.hold: set[str] = set()

    async def start(self, view: ClusterView) -> None:
        self.view = view
        if "nodes" not in self.hold:
            view.replace_nodes(node_facts(n) for n in self.nodes.values())
        if "pods" not in self.hold:
            for scope in view.pod_scopes:
                view.replace_pods(
                    scope,
                    (
                        (key, accounted_pod(pod))
                        for key, pod in self.pods.items()
                        if _in_scope(pod, (scope,))
                    ),
                )
        if "profile" not in self.hold:
            view.set_profile(self.configmap)

    async def stop(self) -> None:
        self.view = None

    def put_node(self, node: Mapping[str, Any]) -> None:
        name = str(node["metadata"]["name"])
        self.nodes[name] = node
        if self.view is not None:
            self.view.node_changed(name, node_facts(node))

    def delete_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        if self.view is not None:
            self.view.node_changed(name, None)

    def put_pod(self, pod: Mapping[str, Any]) -> None:
        key = pod_key(pod)
        self.pods[key] = pod
        if self.view is not None and _in_scope(pod, self.view.pod_scopes):
            self.view.pod_changed(key, accounted_pod(pod))

    def delete_pod(self, key: str) -> None:
        self.pods.pop(key, None)
        if self.view is not None:
            self.view.pod_changed(key, None)

    def put_configmap(self, configmap: Mapping[str, Any] | None) -> None:
        self.configmap = configmap
        if self.view is not None:
            self.view.set_profile(configmap)


# -- the API server -----------------------------------------------------------------------------


class _Gone(Exception):
    """The watch's resource version is too old (HTTP 410): list again."""


class _Informer:
    """List, then watch, one collection; every parsed result is handed to `deliver`."""

    def __init__(
        self,
        name: str,
        call: Callable[[Any], Callable[..., Any]],
        kwargs: Mapping[str, Any],
        on_list: Callable[[list[dict[str, Any]]], Callable[[], None]],
        on_event: Callable[[str, dict[str, Any]], Callable[[], None] | None],
        source: KubernetesSource,
    ) -> None:
        self.name = name
        self.call = call
        self.kwargs = dict(kwargs)
        self.on_list = on_list
        self.on_event = on_event
        self.source = source

    def run(self, deliver: Deliver) -> None:
        source = self.source
        backoff = Backoff(source.backoff_seconds, 30.0 * source.backoff_seconds)
        api: Any = None
        while not source.stopping.is_set():
            try:
                if api is None:
                    api = source.api_factory()
                version = self._list(api, deliver)
                backoff.reset()
                listed = time.monotonic()
                while not source.stopping.is_set():
                    if time.monotonic() - listed >= source.resync_seconds:
                        break
                    version = self._watch(api, version, deliver)
            except _Gone:
                continue
            except Exception as exc:
                source.errors += 1
                log.warning(
                    "informer %s failed (%s); listing again in %.0fs",
                    self.name,
                    describe_error(exc),
                    backoff.delay,
                )
                if source.stopping.wait(backoff.next()):
                    return

    def _list(self, api: Any, deliver: Deliver) -> str:
        response = self.call(api)(**self.kwargs, _preload_content=False, _request_timeout=60)
        try:
            document = orjson.loads(response.data)
        finally:
            response.release_conn()
        if not isinstance(document, dict) or not isinstance(document.get("items"), list):
            raise ValueError(f"the API server answered the {self.name} list oddly")
        items = [item for item in document["items"] if isinstance(item, dict)]
        deliver(self.on_list(items))
        self.source.lists += 1
        return str((document.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, api: Any, version: str, deliver: Deliver) -> str:
        seconds = self.source.watch_seconds
        response = self.call(api)(
            **self.kwargs,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=seconds,
            _preload_content=False,
            _request_timeout=(10, seconds + 60),
        )
        try:
            for line in _kube.watch.watch.iter_resp_lines(response):
                if self.source.stopping.is_set():
                    break
                if not line or line.isspace():
                    continue
                event = orjson.loads(line)
                kind = event.get("type")
                obj = event.get("object")
                if not isinstance(obj, dict):
                    continue
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                meta = obj.get("metadata") or {}
                version = str(meta.get("resourceVersion") or version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    update = self.on_event(str(kind), obj)
                    if update is not None:
                        deliver(update)
        finally:
            response.close()
            response.release_conn()
        return version


class KubernetesSource:
    """Informers for Nodes, planned Pods and the profile ConfigMap, each on a thread."""

    def __init__(
        self,
        pod_namespaces: Iterable[str],
        kubeconfig: str | None = None,
        *,
        resync_seconds: float = 1800,
        watch_seconds: int = 300,
        api_factory: Callable[[], Any] | None = None,
        backoff_seconds: float = 1.0,
    ) -> None:
        self.pod_namespaces = tuple(pod_namespaces)
        self.resync_seconds = resync_seconds
        self.watch_seconds = watch_seconds
        self.backoff_seconds = backoff_seconds
        self.api_factory = api_factory or kubernetes_api(kubeconfig)
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors = 0
        self.lists = 0

    def informers(self, view: ClusterView) -> list[_Informer]:
        settings = view.settings
        name = settings.bundle_configmap

        def profile_list(items: list[dict[str, Any]]) -> Callable[[], None]:
            found = next((i for i in items if (i.get("metadata") or {}).get("name") == name), None)
            configmap = as_configmap(found)
            return lambda: view.set_profile(configmap)

        def profile_event(kind: str, obj: dict[str, Any]) -> Callable[[], None]:
            configmap = None if kind == "DELETED" else as_configmap(obj)
            return lambda: view.set_profile(configmap)

        def nodes_list(items: list[dict[str, Any]]) -> Callable[[], None]:
            facts = [node_facts(item) for item in items]
            return lambda: view.replace_nodes(facts)

        def node_event(kind: str, obj: dict[str, Any]) -> Callable[[], None]:
            facts: NodeFacts | None = None if kind == "DELETED" else node_facts(obj)
            node = str((obj.get("metadata") or {}).get("name") or "")
            return lambda: view.node_changed(node, facts)

        informers = [
            _Informer(
                f"configmap {settings.namespace}/{name}",
                lambda api: _bind(api.list_namespaced_config_map, settings.namespace),
                {"field_selector": f"metadata.name={name}"},
                profile_list,
                profile_event,
                self,
            ),
            _Informer("nodes", lambda api: api.list_node, {}, nodes_list, node_event, self),
        ]
        for scope in self.pod_namespaces:
            informers.append(self._pod_informer(view, scope))
        return informers

    def _pod_informer(self, view: ClusterView, scope: str) -> _Informer:
        def pods_list(items: list[dict[str, Any]]) -> Callable[[], None]:
            pods: list[tuple[str, Accounted]] = [(pod_key(p), accounted_pod(p)) for p in items]
            return lambda: view.replace_pods(scope, pods)

        def pod_event(kind: str, obj: dict[str, Any]) -> Callable[[], None]:
            key = pod_key(obj)
            accounted = None if kind == "DELETED" else accounted_pod(obj)
            return lambda: view.pod_changed(key, accounted)

        def call(api: Any) -> Callable[..., Any]:
            if scope == ALL_NAMESPACES:
                return api.list_pod_for_all_namespaces  # type: ignore[no-any-return]
            return _bind(api.list_namespaced_pod, scope)

        return _Informer(
            f"pods {scope}",
            call,
            {"label_selector": DEPLOYMENT_LABEL},
            pods_list,
            pod_event,
            self,
        )

    async def start(self, view: ClusterView) -> None:
        loop = asyncio.get_running_loop()

        def deliver(update: Callable[[], None]) -> None:
            loop.call_soon_threadsafe(update)

        for informer in self.informers(view):
            thread = threading.Thread(
                target=informer.run,
                args=(deliver,),
                name=f"informer {informer.name}",
                daemon=True,
            )
            self.threads.append(thread)
            thread.start()

    async def stop(self) -> None:
        # The threads are daemons blocked in a bounded watch; they notice the flag at the next
        # event or timeout, and process exit does not wait for them.
        self.stopping.set()


def _bind(function: Callable[..., Any], namespace: str) -> Callable[..., Any]:
    def call(**kwargs: Any) -> Any:
        return function(namespace, **kwargs)

    return call
