"""What the real-node end-to-end modules share: the images the node imports, the tenant stack
whose engine images are the imported probe, and readings of what the kubelet really did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from kits.profilekit import Owner
from kits.stackkit import LARGE, owner_settings, tenant_stack, whole_h100_envelope
from localcluster import ControlPlane, Kube
from localcluster.install.stack import TenantStack
from localcluster.nodes.node_images import (
    PROBE,
    SCHEDULER_REPOSITORY,
    TMI_REPOSITORY,
    NodeImage,
    engine_image_map,
    scheduler_image,
    tmi_image,
)
from localcluster.nodes.node_stack import ChartStack, deploy_chart
from localcluster.nodes.realnode import RealNode
from localcluster.plane.binaries import versions
from localcluster.plane.process import wait_until
from localcluster.servers.engine_pods import engine_pod

RUNNING_TIMEOUT = 90.0


def node_images(workdir: Path) -> list[NodeImage]:
    """The tmi image (the Dockerfile's parts) and the owner's kube-scheduler image."""
    return [tmi_image(workdir / "tmi"), scheduler_image(workdir, versions().kubernetes)]


@contextlib.contextmanager
def real_node_stack(
    plane: ControlPlane,
    node: RealNode,
    prefix: str,
    scheduling_timeout_seconds: int = 120,
    envelope_for: Callable[[Owner, str], dict[str, Any]] = whole_h100_envelope,
) -> Iterator[TenantStack]:
    """The tenant stack (local-process servers) with the whole-H100 profile (or
    `envelope_for`'s), planning engines onto the probe image, with the real node seen by the
    extender."""
    probe = engine_image_map(node.images[PROBE])
    with tenant_stack(plane, prefix, envelope_for, scheduling_timeout_seconds, probe) as up:
        assert up.extender is not None
        up.extender.wait_nodes([node.name])
        yield up


def engine_with_sidecar(stack: TenantStack, name: str) -> dict[str, Any]:
    """The 72B engine Pod (its image the plan's, mapped to the probe) with a sidecar the plan
    grants nothing: the shield must reach that process."""
    pod = engine_pod(
        stack.settings.namespace,
        LARGE,
        name=name,
        container={"name": "engine", "image": "placeholder.invalid/engine:1"},
    )
    # The engine container runs the probe too, serving on :8080: the sidecar runs it without
    # the image's `-listen=:8080` (a command of its own drops the image's arguments), or the
    # second of the two to bind would exit and crash-loop the Pod out of Ready.
    pod["spec"]["containers"].append(
        {
            "name": "sidecar",
            "image": PROBE,
            "imagePullPolicy": "IfNotPresent",
            "command": ["/usr/bin/tmi-probe"],
        }
    )
    return pod


def probe_pod(namespace: str, name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """A plain Pod of the probe image, one container ``tool`` (with ``env`` in its spec)."""
    container: dict[str, Any] = {"name": "tool", "image": PROBE, "imagePullPolicy": "IfNotPresent"}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 0},
    }


def running(pod: dict[str, Any]) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)


def condition_is(pod: dict[str, Any], kind: str, status: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == status
        for c in pod.get("status", {}).get("conditions") or []
    )


def is_ready(pod: dict[str, Any]) -> bool:
    return condition_is(pod, "Ready", "True")


def wait_pod(
    kube: Kube,
    namespace: str,
    name: str,
    until: Callable[[dict[str, Any]], bool] = running,
    timeout: float = RUNNING_TIMEOUT,
) -> dict[str, Any]:
    """The Pod once ``until`` holds for it (by default: every container running)."""

    def probe() -> dict[str, Any] | None:
        pod = kube.get("v1", "Pod", name, namespace)
        return pod if until(pod) else None

    return wait_until(probe, timeout=timeout, what=f"Pod {namespace}/{name}")


@contextlib.contextmanager
def chart_on_node(plane: ControlPlane, node: RealNode, prefix: str) -> Iterator[ChartStack]:
    """The chart with its Deployments on the node, the whole-H100 profile, engines on the probe."""
    probe = engine_image_map(node.images[PROBE])
    settings, profile = owner_settings(prefix, whole_h100_envelope, 120, probe)
    # The owner's part in a namespace of this stack's own, not the chart's default: the stack
    # leaves the namespaces it made behind, and the first-day walk installs into the default
    # one on the same node's plane as a newcomer would, expecting to create it.
    settings = replace(settings, scheduler_namespace=f"{settings.namespace}-scheduling")
    images = {image.repository: image for image in node.images.values()}
    with deploy_chart(
        plane,
        settings,
        profile,
        tmi=images[TMI_REPOSITORY],
        scheduler=images[SCHEDULER_REPOSITORY],
    ) as up:
        plane.grant_namespace_admin("tmi-installer", settings.namespace)
        yield up
