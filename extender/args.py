"""Reading kube-scheduler's ExtenderArgs: the Pod, and the candidate nodes with their facts.

The scheduler sends either node names (node-cache mode, `nodeCacheCapable: true`), which are
looked up in the extender's node cache, or whole Node objects, which are parsed unless the cache
holds the same revision already. A body that is neither is an `ArgsError`, answered 400.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from extender.wire import ExtenderArgs
from inference_policy.base.pod_view import ObjectView, PodView
from inference_policy.base.wire import PLAN_ANNOTATION
from inference_policy.placing.nodes import NodeFacts, node_facts


class ArgsError(ValueError):
    """The body is not an ExtenderArgs the extender can answer; the message says why."""


@dataclass(frozen=True, slots=True)
class Candidates:
    """The nodes one call names: by name (`cache_mode`) or as Node objects (`items`, echoed back
    in full-node mode with the list's `list_meta`), each with its facts (None: not cached)."""

    cache_mode: bool
    names: list[str]
    facts: list[NodeFacts | None]
    items: list[Any]
    list_meta: Any


def has_plan(pod: Mapping[str, Any]) -> bool:
    return PLAN_ANNOTATION in PodView(pod).annotations


def extender_args(body: object) -> ExtenderArgs:
    """The decoded body as ExtenderArgs once it is a JSON object; its fields are checked where
    they are read."""
    if not isinstance(body, dict):
        raise ArgsError("the body is not an ExtenderArgs object")
    return cast(ExtenderArgs, body)


def pod_of(args: ExtenderArgs) -> Mapping[str, Any]:
    if not isinstance(args, Mapping):
        raise ArgsError("the body is not an ExtenderArgs object")
    pod = args.get("Pod")
    if not isinstance(pod, Mapping):
        raise ArgsError("ExtenderArgs.Pod is missing or not an object")
    return pod


def candidates(args: ExtenderArgs, cache: Mapping[str, NodeFacts]) -> Candidates:
    """The call's candidates, their facts taken from `cache` (the node informer's) by name in
    node-cache mode, or by revision when whole Nodes are sent."""
    names_raw = args.get("NodeNames")
    if names_raw is not None:
        # map() keeps both passes in C: every scheduling cycle sends every candidate's name.
        if not isinstance(names_raw, list) or not set(map(type, names_raw)) <= {str}:
            raise ArgsError("ExtenderArgs.NodeNames is not a list of node names")
        return Candidates(True, names_raw, list(map(cache.get, names_raw)), [], None)
    node_list = args.get("Nodes")
    if node_list is None:
        raise ArgsError("ExtenderArgs carries neither Nodes nor NodeNames")
    items = node_list.get("items") if isinstance(node_list, Mapping) else None
    if items is None:
        items = []
    if not isinstance(items, list):
        raise ArgsError("ExtenderArgs.Nodes.items is not a list")
    names: list[str] = []
    facts: list[NodeFacts | None] = []
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ArgsError(f"ExtenderArgs.Nodes.items[{index}] is not a Node object")
        node = ObjectView(item)
        name = node.name
        if not name:
            raise ArgsError(f"ExtenderArgs.Nodes.items[{index}] has no metadata.name")
        version = node.resource_version
        cached = cache.get(name)
        # Reuse the informer's parse (and its memo) when the scheduler sent the same revision.
        if cached is not None and version and cached.version == version:
            facts.append(cached)
        else:
            facts.append(node_facts(item))
        names.append(name)
    return Candidates(False, names, facts, items, ObjectView(node_list).metadata)


__all__ = ["ArgsError", "Candidates", "candidates", "has_plan", "pod_of"]
