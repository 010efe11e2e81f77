"""Local Kubernetes 1.36 control plane (etcd, kube-apiserver, kube-scheduler, KWOK).

Exists so e2e tests and demos run the project's webhook, scheduler extender,
controller and guard manifests against the real API server and scheduler rather than
mocks, without a kubelet, containers or network access. See ``ControlPlane.start``.
"""

from localcluster.nodes.kwok import FakeNode, create_fake_nodes, delete_fake_nodes, node_table
from localcluster.plane.binaries import BinariesMissingError, bin_dir, default_bin_dir, versions
from localcluster.plane.controlplane import (
    DEFAULT_SCHEDULER,
    IDENTITIES,
    KWOK_NODE_ANNOTATION,
    ControlPlane,
    Scheduler,
    default_scheduler_config,
)
from localcluster.plane.kube import ApiError, Kube, load_documents, pod_condition
from localcluster.plane.process import ComponentError, wait_until

__all__ = [
    "DEFAULT_SCHEDULER",
    "IDENTITIES",
    "KWOK_NODE_ANNOTATION",
    "ApiError",
    "BinariesMissingError",
    "ComponentError",
    "ControlPlane",
    "FakeNode",
    "Kube",
    "Scheduler",
    "bin_dir",
    "create_fake_nodes",
    "default_bin_dir",
    "default_scheduler_config",
    "delete_fake_nodes",
    "load_documents",
    "node_table",
    "pod_condition",
    "versions",
    "wait_until",
]
