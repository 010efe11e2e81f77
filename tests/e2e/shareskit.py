"""Two tenants' accounted VRAM shares on shared GPU nodes, for the e2e tests that place them:
each tenant with its own owner key and a signed profile of two share bindings, one per GPU of
the node's VRAM plugin (`kamiwaza.ai/vram-gb-gpu-0`, `-gpu-1`), and the waits on what the
extender publishes and the controller verifies."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable
from typing import Any

from inference_policy.planning.room import ROOM_CONFIGMAP, ROOM_KEY, parse_figures
from kits.profilekit import CLUSTER, Owner, gpu_binding, gpu_profile, request, with_profiles
from kits.stackkit import dated
from localcluster import ApiError, ControlPlane, Kube
from localcluster.install.stack import CONDITION, condition, engine_pod
from localcluster.install.stack_settings import StackSettings
from localcluster.plane.process import wait_until
from localcluster.servers.webhook_objects import publish_profile

GPU0, GPU1 = "share-gpu0", "share-gpu1"
VRAM = "kamiwaza.ai/vram-gb-gpu-"


def share_envelope(owner: Owner, namespace: str, *, trust: bool = False, version: int = 1) -> Any:
    bindings = []
    for index in (0, 1):
        binding = gpu_binding(
            f"share-gpu{index}",
            allocator="vram-plugin",
            resource=f"{VRAM}{index}",
            cc="9.0",
            memory="79Gi",
        )
        if trust:
            binding["sharing"] = {"acrossTenants": True}
        bindings.append(binding)
    envelope = with_profiles(owner, gpu_profile("nvidia-share", "accounted-share", bindings))
    envelope["version"] = version
    return dated(envelope, namespace)


def share(memory: str) -> dict[str, Any]:
    """A request for an accounted share of `memory` (the share is exactly that many GiB); it
    names no profile, so its webhook may pass over a binding without room."""
    block = {
        "schemaVersion": 1,
        "accelerator": {
            "capability": "gpu",
            "count": 1,
            "memory": {"minimum": memory},
            "isolation": "any-qualified",
        },
        "runtime": {"selection": "automatic"},
    }
    return request(inferenceResources=block)


class Tenant:
    """One tenant namespace: its owner key, settings and current signed profile."""

    def __init__(self, owner: Owner, settings: StackSettings, profile: dict[str, Any]) -> None:
        self.owner, self.settings, self.profile = owner, settings, profile

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    @property
    def bundle(self) -> str:
        return str(self.profile["data"]["bundle.sha256"])

    def republish(self, plane: ControlPlane, *, trust: bool, version: int) -> None:
        envelope = share_envelope(self.owner, self.namespace, trust=trust, version=version)
        self.profile = self.owner.sign(envelope, name=self.settings.bundle_configmap)
        publish_profile(plane, self.profile)


def new_tenant(prefix: str) -> Tenant:
    owner = Owner()
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    settings = StackSettings(
        owner_public_keys=(owner.public_key,),
        cluster_binding_id=CLUSTER,
        namespace=namespace,
        scheduling_timeout_seconds=60,
    )
    envelope = share_envelope(owner, namespace)
    return Tenant(owner, settings, owner.sign(envelope, name=settings.bundle_configmap))


def room(kube: Kube, tenant: Tenant) -> dict[str, int] | None:
    """The largest free amount on one node per binding, as published to the tenant's webhook
    for its current profile."""
    try:
        configmap = kube.get("v1", "ConfigMap", ROOM_CONFIGMAP, tenant.namespace)
    except ApiError:
        return None
    figures = parse_figures(configmap["data"][ROOM_KEY])
    if figures.bundle != tenant.bundle:
        return None
    return dict(figures.largest)


def wait_room(kube: Kube, tenant: Tenant, want: dict[str, int]) -> None:
    kube.wait_for(
        "v1",
        "Namespace",
        tenant.namespace,
        None,
        lambda _: room(kube, tenant) == want,
        timeout=60,
        what=f"{tenant.namespace}'s room figures {want}",
    )


def verified(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = kube.wait_for(
        "v1",
        "Pod",
        name,
        namespace,
        lambda p: (
            bool(p["spec"].get("nodeName"))
            and (condition(p, CONDITION) or {}).get("status") == "True"
        ),
        timeout=90,
        what=f"Pod {namespace}/{name} placed and verified",
    )
    return pod


def plan_of(pod: dict[str, Any]) -> dict[str, Any]:
    plan: dict[str, Any] = json.loads(pod["metadata"]["annotations"]["kamiwaza.ai/plan"])
    return plan


Create = Callable[[str, str, dict[str, Any], str, str], str]


def create_once_planned(
    installer: Kube,
    namespace: str,
    prefix: str,
    document: dict[str, Any],
    accept: Callable[[dict[str, Any]], bool],
    what: str,
) -> str:
    """Create an engine Pod once the tenant's webhook, asked by a dry run, plans it as `accept`
    wants: the room figures reach the webhook through its own watch, a moment after the owner's
    extender writes them, so a test that steers by them waits for the webhook to see them."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    pod = engine_pod(namespace, document, name=name)
    wait_until(
        lambda: accept(plan_of(installer.create(copy.deepcopy(pod), dry_run=True))),
        timeout=60,
        what=f"{namespace}'s webhook to plan {what}",
    )
    installer.create(pod)
    return name


def creator(plane: ControlPlane) -> Create:
    """Create an engine Pod once the tenant's webhook plans it on `binding` by `rule`."""
    installer = plane.kube("tmi-installer")

    def create(
        namespace: str, prefix: str, document: dict[str, Any], binding: str, rule: str
    ) -> str:
        return create_once_planned(
            installer,
            namespace,
            prefix,
            document,
            lambda plan: plan["bindingId"] == binding and plan["choice"]["rule"] == rule,
            f"{binding} ({rule})",
        )

    return create
