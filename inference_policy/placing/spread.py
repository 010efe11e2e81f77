"""Replicas of one deployment apart, different deployments packed: the prioritize scores' last
step.

Seed 002 warns that two replicas on one GPU are no evidence of resilience to that GPU failing,
and best fit, left alone, consolidates: the node the first replica part-filled is the best fit
for the second. So where some candidate already holds a replica of the Pod's deployment (its
`kamiwaza.ai/deployment-id`, within its namespace), every fitting node holding none ranks above
every node holding one, and among those holding one, fewer replicas rank higher (1 to 3: from
three replicas on, alike). It is a score, not a filter: when only a node holding a replica has
room, the replica still goes there. Nothing changes for a deployment with no replica placed
yet, so different deployments pack exactly as before; for one that has, best fit still orders
the nodes holding none, though more coarsely (the extender's 0..10 range, squeezed into 4..10,
ties some neighbouring grades).

Replicas are known from the extender's Pod watch, once bound: two replicas scheduled back to
back can reach prioritize before the first one's bind is seen, and then both take best fit's
node. A deployment's later replicas, and a rollout's, are spread.

Apart on nodes is also apart on physical devices: a node's device plugin or DRA driver chooses
the device within the node, so distinct nodes are the separation the extender can give.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inference_policy.base.pod_view import PodView
from inference_policy.base.wire import ENGINE_LABEL

MAX_SCORE = 10
# Fitting nodes that hold no replica score in [APART, MAX_SCORE], their best-fit order kept;
# nodes that hold some score in [1, APART - 1], fewer replicas higher.
APART = 4


def spread_replicas(scores: Sequence[int], replicas: Sequence[int]) -> list[int]:
    """``scores`` (0..10) of the candidates prioritize is given, every one of which passed the
    filter, with ``replicas`` (how many of the Pod's deployment each holds) taken first: those
    holding none keep their order above those holding some. Unchanged where none holds one."""
    if not any(count > 0 for count in replicas):
        return list(scores)
    span = MAX_SCORE - APART
    return [
        APART + (span * score) // MAX_SCORE if count == 0 else max(1, APART - count)
        for score, count in zip(scores, replicas, strict=True)
    ]


def deployment_of(pod: Mapping[str, Any]) -> str | None:
    """The Pod's deployment, `<namespace>/<kamiwaza.ai/deployment-id>`; None when it names
    none. Within its namespace only: one owner release serves several tenants, and neither
    tenant's ids may push the other's replicas about."""
    view = PodView(pod)
    value = view.label(ENGINE_LABEL)
    if not value:
        return None
    return f"{view.namespace or ''}/{value}"


class ReplicaIndex:
    """How many bound Pods of each deployment each node holds, kept as informer events arrive
    (a few dictionary operations each)."""

    def __init__(self) -> None:
        self._pods: dict[str, tuple[str, str]] = {}
        self._nodes: dict[str, dict[str, int]] = {}

    def apply(self, key: str, deployment: str | None, node: str | None) -> None:
        """Pod ``key`` of ``deployment`` is bound to ``node`` now (None: holds no node)."""
        now = (deployment, node) if deployment is not None and node is not None else None
        before = self._pods.get(key)
        if before == now:
            return
        if before is not None:
            del self._pods[key]
            counts = self._nodes[before[0]]
            counts[before[1]] -= 1
            if counts[before[1]] == 0:
                del counts[before[1]]
            if not counts:
                del self._nodes[before[0]]
        if now is not None:
            self._pods[key] = now
            counts = self._nodes.setdefault(now[0], {})
            counts[now[1]] = counts.get(now[1], 0) + 1

    def counts(self, deployment: str | None) -> Mapping[str, int]:
        """Node name -> how many of ``deployment``'s Pods it holds (empty for None)."""
        if deployment is None:
            return _EMPTY
        return self._nodes.get(deployment) or _EMPTY


_EMPTY: Mapping[str, int] = {}


__all__ = ["APART", "ReplicaIndex", "deployment_of", "spread_replicas"]
