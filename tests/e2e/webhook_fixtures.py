"""Fixtures that put the admission webhook behind the session's real API server.

Loaded by the admission modules (tests/e2e/admission/) through ``pytest_plugins``. The webhook
configuration is cluster-scoped and fails closed, so the deployment is module-scoped and its
teardown removes the configuration (waiting until the API server stops calling it) and the
namespace's opt-in label before the process stops: the e2e modules that run afterwards see the
cluster as it was.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kits.profilekit import CLUSTER, NAMESPACE, Owner
from localcluster import ApiError, ControlPlane, Kube
from localcluster.servers.webhook import (
    DEFAULT_BUNDLE_CONFIGMAP,
    LocalWebhook,
    WebhookSettings,
    deploy_webhook,
)

GPU_SECRET = "kamiwaza-pull"
CPU_SECRET = "kamiwaza-cpu-pull"
SCHEDULER = "kamiwaza-inference-scheduler"


@dataclass
class Deployed:
    """The running webhook and what it was deployed with."""

    hook: LocalWebhook
    owner: Owner
    profile: dict[str, Any]


@pytest.fixture(scope="module")
def webhook(control_plane: ControlPlane) -> Iterator[Deployed]:
    owner = Owner()
    profile = owner.sign(name=DEFAULT_BUNDLE_CONFIGMAP)
    settings = WebhookSettings(
        owner_public_keys=(owner.public_key,),
        cluster_binding_id=CLUSTER,
        namespace=NAMESPACE,
        scheduler_name=SCHEDULER,
        gpu_registry_credentials_secret=GPU_SECRET,
        cpu_registry_credentials_secret=CPU_SECRET,
    )
    hook = deploy_webhook(control_plane, settings, profile)
    try:
        yield Deployed(hook, owner, profile)
    finally:
        hook.stop()


@pytest.fixture(scope="module")
def installer(control_plane: ControlPlane, webhook: Deployed) -> Kube:
    """The namespace admin of kamiwaza (not system:masters), as the platform's installer is."""
    control_plane.grant_namespace_admin("tmi-installer", NAMESPACE)
    return control_plane.kube("tmi-installer")


@pytest.fixture
def kamiwaza_pods(control_plane: ControlPlane) -> Iterator[Callable[[str], str]]:
    """Names for Pods a test really creates in kamiwaza; they are deleted afterwards."""
    names: list[str] = []

    def make(prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        names.append(name)
        return name

    yield make
    kube = control_plane.kube("admin")
    for name in names:
        # Grace 0: no kubelet confirms termination.
        with contextlib.suppress(ApiError):
            kube.delete("v1", "Pod", name, NAMESPACE, grace_period_seconds=0)
