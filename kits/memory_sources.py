"""Sources that feed the webhook and the extender from dicts instead of an API server.

They drive the very entry points the informers drive (`policy_io.feed.PolicyFeed`'s input side
and `extender.view.ClusterView`'s callbacks), so tests and benchmarks exercise the servers'
state without a cluster; `put_*` and `delete_*` act as watch events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from extender.config import ALL_NAMESPACES
from extender.view import ClusterView
from inference_policy.base.wire import ENGINE_LABEL as DEPLOYMENT_LABEL
from inference_policy.placing.ledger import accounted_pod, pod_key
from inference_policy.placing.nodes import node_facts
from inference_policy.placing.spread import deployment_of
from policy_io.state import PROFILE_LABEL
from webhook.profile_source import PolicyStore


def _is_profile(configmap: Mapping[str, Any] | None) -> bool:
    metadata = configmap.get("metadata") if configmap is not None else None
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return isinstance(labels, Mapping) and labels.get(PROFILE_LABEL) == "true"


class WebhookMemorySource:
    """The webhook's ConfigMaps from memory, by name."""

    def __init__(self, configmaps: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.configmaps: dict[str, Mapping[str, Any]] = dict(configmaps or {})
        self.store: PolicyStore | None = None

    async def start(self, store: PolicyStore) -> None:
        self.store = store
        feed = store.feed
        for name in feed.names:
            feed.read(name, self.configmaps.get(name))
        if feed.follows:
            feed.revisions_listed({n: c for n, c in self.configmaps.items() if _is_profile(c)})

    def put(self, name: str, configmap: Mapping[str, Any] | None) -> None:
        """Create, replace (None: delete) a ConfigMap, as a watch event would."""
        previous = self.configmaps.get(name)
        if configmap is None:
            self.configmaps.pop(name, None)
        else:
            self.configmaps[name] = configmap
        if self.store is not None:
            feed = self.store.feed
            feed.read(name, configmap)
            if feed.follows and (_is_profile(configmap) or _is_profile(previous)):
                feed.revision_changed(name, configmap if _is_profile(configmap) else None)

    async def stop(self) -> None:
        self.store = None


def _in_scope(pod: Mapping[str, Any], scopes: tuple[str, ...]) -> bool:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if DEPLOYMENT_LABEL not in labels:
        return False
    return ALL_NAMESPACES in scopes or meta.get("namespace") in scopes


class ExtenderMemorySource:
    """Nodes, Pods and the profile from memory: `configmap` is the first tenant's, `profiles`
    any tenant's by namespace. An input named in `hold` ("nodes", "pods", "profile") is not
    delivered at start, so the view stays unready for it."""

    def __init__(
        self,
        nodes: Iterable[Mapping[str, Any]] = (),
        pods: Iterable[Mapping[str, Any]] = (),
        configmap: Mapping[str, Any] | None = None,
        profiles: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.nodes: dict[str, Mapping[str, Any]] = {str(n["metadata"]["name"]): n for n in nodes}
        self.pods: dict[str, Mapping[str, Any]] = {pod_key(p): p for p in pods}
        self.configmap = configmap
        self.profiles = dict(profiles or {})
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
                        (key, accounted_pod(pod), deployment_of(pod))
                        for key, pod in self.pods.items()
                        if _in_scope(pod, (scope,))
                    ),
                )
        if "profile" not in self.hold:
            self._deliver_profile(view)

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
            self.view.pod_changed(key, accounted_pod(pod), deployment_of(pod))

    def delete_pod(self, key: str) -> None:
        self.pods.pop(key, None)
        if self.view is not None:
            self.view.pod_changed(key, None)

    def put_configmap(self, configmap: Mapping[str, Any] | None) -> None:
        self.configmap = configmap
        if self.view is not None:
            self._deliver_profile(self.view)

    def _deliver_profile(self, view: ClusterView) -> None:
        for namespace, feed in view.feeds.items():
            cm = self.profiles.get(namespace, self.configmap if feed is view.feed else None)
            if not feed.follows:
                feed.profile_read(cm)
                continue
            name = str((cm.get("metadata") or {}).get("name")) if cm is not None else ""
            feed.revisions_listed({name: cm} if cm is not None else {})
