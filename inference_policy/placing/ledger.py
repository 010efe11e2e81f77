"""What each node holds: the Pods bound to it and their effective requests.

The extender judges free capacity from the Pods the API server reports as bound, so it counts a
Pod the way kube-scheduler does (containers, sidecars, init containers, RuntimeClass overhead)
and keeps per-node totals that an informer event updates in a few dictionary operations.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from inference_policy.base.pod_view import PodView
from inference_policy.base.quantity import QuantityError, resource_units
from inference_policy.base.wire import ENGINE_LABEL
from inference_policy.placing.tenancy import Shares, TenantShares, tenant_of

_TERMINATED = ("Succeeded", "Failed")

# The Pods `accounted_pod` can count, as a field selector the API server applies to a list and a
# watch: bound, and not terminated. A watcher given it hears nothing of a Pod until it is bound
# (the scheduler's own create and status events on a pending Pod are most of a Pod's traffic
# before it runs), and a Pod that terminates leaves the selection as a DELETED event, which is
# what its end means to the ledger. `accounted_pod` still checks both, for Pods from elsewhere.
HOLDING_PODS_FIELD_SELECTOR = ",".join(
    ["spec.nodeName!="] + [f"status.phase!={phase}" for phase in _TERMINATED]
)


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for key, value in more.items():
        total[key] = total.get(key, 0) + value


def _container_requests(container: Any) -> dict[str, int]:
    if not isinstance(container, Mapping):
        raise ValueError("a container is not an object")
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise ValueError(f"container {container.get('name')!r}: resources is not an object")
    out: dict[str, int] = {}
    # The API server defaults a missing request to its limit; apply the same rule so a Pod seen
    # before defaulting (or from a test) counts what the kubelet will grant.
    for section in ("limits", "requests"):
        values = resources.get(section) or {}
        if not isinstance(values, Mapping):
            raise ValueError(f"container {container.get('name')!r}: {section} is not an object")
        for name, quantity in values.items():
            try:
                out[str(name)] = resource_units(str(name), quantity)
            except QuantityError as exc:
                raise ValueError(f"container {container.get('name')!r}: {exc}") from None
    return out


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The Pod's effective requests as kube-scheduler computes them.

    Containers and restartable init containers (sidecars) add up; an ordinary init container
    runs alone beside the sidecars declared before it, so the larger of the two totals counts;
    the RuntimeClass overhead is added on top. Raises ValueError for an unreadable spec.
    """
    spec = pod.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ValueError("spec is not an object")
    total: dict[str, int] = {}
    for kind in ("containers", "initContainers"):
        if not isinstance(spec.get(kind) or [], list):
            raise ValueError(f"spec.{kind} is not a list")
    for container in spec.get("containers") or ():
        _add(total, _container_requests(container))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for container in spec.get("initContainers") or ():
        requests = _container_requests(container)
        if isinstance(container, Mapping) and container.get("restartPolicy") == "Always":
            _add(sidecars, requests)
            _add(total, requests)
            continue
        running = dict(sidecars)
        _add(running, requests)
        for key, value in running.items():
            init_peak[key] = max(init_peak.get(key, 0), value)
    for key, value in init_peak.items():
        total[key] = max(total.get(key, 0), value)
    overhead = spec.get("overhead") or {}
    if isinstance(overhead, Mapping):
        try:
            _add(total, {str(k): resource_units(str(k), v) for k, v in overhead.items()})
        except QuantityError as exc:
            raise ValueError(f"spec.overhead: {exc}") from None
    return total


def accounted_pod(pod: Mapping[str, Any]) -> tuple[str, dict[str, int]] | None:
    """`(node, requests)` for a Pod that holds resources on a node now, else None.

    A Pod holds its requests from the moment it is bound (`spec.nodeName`) until it has
    terminated; a Pod being deleted still holds them until it is gone, as the scheduler counts.
    A Pod whose requests cannot be read counts as holding nothing rather than stopping the
    informer: the scheduler's own fit check still counts it.
    """
    view = PodView(pod)
    node = view.node_name
    if node is None or view.phase in _TERMINATED:
        return None
    try:
        return node, pod_requests(pod)
    except ValueError:
        return None


def pod_key(pod: Mapping[str, Any]) -> str:
    """`namespace/name`: unique among live Pods, and lets one namespace's Pods be re-listed."""
    view = PodView(pod)
    return f"{view.namespace or ''}/{view.name or ''}"


# What `accounted_pod` and `pod_key` read of a Pod, and what an informer needs besides to tell
# revisions and incarnations apart (uid, resourceVersion).
_KEPT_METADATA = ("name", "namespace", "uid", "resourceVersion")
_KEPT_SPEC = ("nodeName", "overhead")
_KEPT_CONTAINER = ("name", "resources", "restartPolicy")


def holding_part(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a Pod that decides what it holds: `accounted_pod` and `pod_key` answer the
    same for it as for the whole Pod, and nothing else is kept but its deployment label.

    For a cache of many Pods (the extender's informer keeps every bound engine Pod): a whole Pod
    is a hundred-odd objects (annotations, environment, probes, volumes, status conditions),
    every one of them scanned by each of Python's full garbage collections, which pause the
    event loop that answers the scheduler. A value of a shape the ledger would refuse is kept as
    it came, so the refusal is the same too."""
    out: dict[str, Any] = {}
    for key in ("apiVersion", "kind"):
        if key in pod:
            out[key] = pod[key]
    meta = pod.get("metadata")
    if isinstance(meta, Mapping):
        out["metadata"] = {key: meta[key] for key in _KEPT_METADATA if key in meta}
        labels = meta.get("labels")
        # The deployment the Pod is a replica of, for spreading its siblings apart.
        if isinstance(labels, Mapping) and ENGINE_LABEL in labels:
            out["metadata"]["labels"] = {ENGINE_LABEL: labels[ENGINE_LABEL]}
    elif meta is not None:
        out["metadata"] = meta
    spec = pod.get("spec")
    if isinstance(spec, Mapping):
        kept = {key: spec[key] for key in _KEPT_SPEC if key in spec}
        for kind in ("containers", "initContainers"):
            containers = spec.get(kind)
            if isinstance(containers, list):
                kept[kind] = [
                    {key: c[key] for key in _KEPT_CONTAINER if key in c}
                    if isinstance(c, Mapping)
                    else c
                    for c in containers
                ]
            elif kind in spec:
                kept[kind] = containers
        out["spec"] = kept
    elif spec is not None:
        out["spec"] = spec
    status = pod.get("status")
    if isinstance(status, Mapping):
        out["status"] = {"phase": status["phase"]} if "phase" in status else {}
    elif status is not None:
        out["status"] = status
    return out


class UsageLedger:
    """Requests of the Pods bound to each node, kept as per-node totals.

    Updates are incremental (a Pod's previous contribution is taken back before its new one is
    added), so an informer event costs a few dictionary operations however many Pods there are.
    Every change bumps `version` and is logged against its node, so a reader that remembers the
    version it last saw can ask which nodes changed since (`changed_since`) and redo only those.
    Beside the totals, each node's accounted shares by tenant (the key's namespace), which
    `tenancy` keeps tenants apart by (`shares`).
    """

    def __init__(self, history: int = 4096) -> None:
        self._pods: dict[str, tuple[str, dict[str, int]]] = {}
        self._nodes: dict[str, dict[str, int]] = {}
        self._shares = TenantShares()
        self.version = 0
        self._changes: deque[tuple[int, str]] = deque(maxlen=history)

    def _touch(self, node: str) -> None:
        self.version += 1
        self._changes.append((self.version, node))

    def changed_since(self, version: int) -> set[str] | None:
        """The nodes whose totals changed after `version`; None when the log no longer reaches
        back that far (the reader must then look at every node)."""
        if version == self.version:
            return set()
        changes = self._changes
        if version > self.version or not changes or changes[0][0] > version + 1:
            return None
        out: set[str] = set()
        for stamp, node in reversed(changes):
            if stamp <= version:
                break
            out.add(node)
        return out

    def __len__(self) -> int:
        return len(self._pods)

    def upsert(self, key: str, node: str, requests: Mapping[str, int]) -> None:
        previous = self._pods.get(key)
        if previous is not None and previous[0] == node and previous[1] == requests:
            # A bound Pod's status updates (Running, its conditions) change nothing it holds:
            # no version bump, so readers' cached judgements of the node stay valid.
            return
        self.remove(key)
        stored = dict(requests)
        self._pods[key] = (node, stored)
        _add(self._nodes.setdefault(node, {}), stored)
        self._shares.change(node, tenant_of(key), stored, 1)
        self._touch(node)

    def remove(self, key: str) -> None:
        previous = self._pods.pop(key, None)
        if previous is None:
            return
        node, requests = previous
        self._touch(node)
        self._shares.change(node, tenant_of(key), requests, -1)
        totals = self._nodes.get(node)
        if totals is None:  # pragma: no cover - the two maps change together
            return
        for name, value in requests.items():
            left = totals.get(name, 0) - value
            if left > 0:
                totals[name] = left
            else:
                totals.pop(name, None)
        if not totals:
            del self._nodes[node]

    def apply(self, key: str, pod: Mapping[str, Any] | None) -> None:
        """A Pod as an informer sees it now (None: deleted)."""
        accounted = accounted_pod(pod) if pod is not None else None
        if accounted is None:
            self.remove(key)
        else:
            self.upsert(key, *accounted)

    def used(self, node: str) -> Mapping[str, int]:
        return self._nodes.get(node) or _EMPTY

    def shares(self, node: str) -> Shares:
        """The node's accounted shares: resource -> tenant -> units."""
        return self._shares.of(node)

    @property
    def shares_get(self) -> Callable[[str], Shares | None]:
        """`shares` as one C call, None for a node that holds none: for placement's passes."""
        return self._shares.get

    def pod_keys(self) -> set[str]:
        return set(self._pods)

    def node_of(self, key: str) -> str | None:
        entry = self._pods.get(key)
        return entry[0] if entry else None


_EMPTY: Mapping[str, int] = {}


__all__ = [
    "HOLDING_PODS_FIELD_SELECTOR",
    "UsageLedger",
    "accounted_pod",
    "holding_part",
    "pod_key",
    "pod_requests",
]
