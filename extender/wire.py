"""The scheduler extender protocol's objects (k8s.io/kube-scheduler/extender/v1), as typed shapes.

kube-scheduler posts an `ExtenderArgs` to `filter` and `prioritize` and reads an
`ExtenderFilterResult` or a `HostPriorityList` back. These TypedDicts name the fields the extender
reads and writes, so the type checker follows an answer from where it is built to where it is
encoded. They describe JSON as decoded and cost nothing at run time: the arguments are checked
field by field where they are read (an `ArgsError` names what is wrong), and everything the
extender has not checked stays typed as unchecked.
"""

from __future__ import annotations

from typing import Any, TypedDict


class ExtenderArgs(TypedDict, total=False):
    """What the scheduler sends: the Pod, and its candidates as full Nodes or (with
    `nodeCacheCapable`) as names. Unchecked until read."""

    Pod: Any
    Nodes: Any
    NodeNames: Any


class NodeList(TypedDict):
    """The candidates kept, in full-node mode: the list's metadata and the Node objects echoed
    back exactly as received."""

    metadata: Any
    items: list[Any]


class ExtenderFilterResult(TypedDict):
    """The filter's answer. Exactly one of `Nodes` and `NodeNames` carries the kept nodes (the
    one the scheduler sent); a node in `FailedAndUnresolvableNodes` is skipped by preemption."""

    Nodes: NodeList | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class HostPriority(TypedDict):
    Host: str
    Score: int


HostPriorityList = list[HostPriority]

__all__ = [
    "ExtenderArgs",
    "ExtenderFilterResult",
    "HostPriority",
    "HostPriorityList",
    "NodeList",
]
