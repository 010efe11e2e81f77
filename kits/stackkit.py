"""What the end-to-end modules that run the whole tenant stack share: the whole-H100 binding and
the 72B engine that needs it, a signed profile dated around now, the module's stack in its own
namespace, and Pod names that are cleaned up after each test.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from kits.profilekit import CLUSTER, Owner, gpu_binding, gpu_profile, request, with_profiles
from localcluster import (
    ApiError,
    ControlPlane,
    FakeNode,
    Kube,
    create_fake_nodes,
    delete_fake_nodes,
)
from localcluster.install.stack import (
    CONDITION,
    StackSettings,
    TenantStack,
    condition,
    deploy_stack,
)

WHOLE = "whole-h100-amd64"
# A 72B GGUF at Q4 (47 GB): one whole H100.
LARGE = request(
    "llamacpp",
    model__name="Qwen/Qwen2.5-72B-Instruct-GGUF",
    model__weightsBytes=47_000_000_000,
    model__layers=80,
    model__kvHeads=8,
)


class _NodeOverrides(TypedDict, total=False):
    """FakeNode fields a stack's node sets only when asked to (else the FakeNode default)."""

    gpu_product: str


def whole_h100_profile() -> dict[str, Any]:
    """The whole-device profile with the one H100 binding."""
    return gpu_profile(
        "nvidia-whole",
        "whole-device",
        [gpu_binding(WHOLE, cc="9.0", memory="79Gi", features=["bf16", "fp8", "p2p"])],
    )


def dated(envelope: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The envelope for `namespace`, valid from yesterday for a month."""
    now = datetime.now(UTC)
    envelope["namespace"] = namespace
    envelope["issuedAt"] = (now - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    envelope["expiresAt"] = (now + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return envelope


def owner_settings(
    prefix: str,
    envelope_for: Callable[[Owner, str], dict[str, Any]],
    scheduling_timeout_seconds: int,
    engine_image_map: tuple[tuple[str, str], ...] = (),
) -> tuple[StackSettings, dict[str, Any]]:
    """A new owner's settings for a fresh namespace `prefix-…`, and its signed `envelope_for`."""
    owner = Owner()
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    settings = StackSettings(
        owner_public_keys=(owner.public_key,),
        cluster_binding_id=CLUSTER,
        namespace=namespace,
        scheduling_timeout_seconds=scheduling_timeout_seconds,
        engine_image_map=engine_image_map,
    )
    return settings, owner.sign(envelope_for(owner, namespace))


@contextlib.contextmanager
def tenant_stack(
    control_plane: ControlPlane,
    prefix: str,
    envelope_for: Callable[[Owner, str], dict[str, Any]],
    scheduling_timeout_seconds: int,
    engine_image_map: tuple[tuple[str, str], ...] = (),
) -> Iterator[TenantStack]:
    """The stack in a fresh namespace `prefix-…`, with the owner's signed `envelope_for` and
    `tmi-installer` as the namespace's admin."""
    settings, profile = owner_settings(
        prefix, envelope_for, scheduling_timeout_seconds, engine_image_map
    )
    with deploy_stack(control_plane, settings, profile) as up:
        control_plane.grant_namespace_admin("tmi-installer", settings.namespace)
        yield up


def whole_h100_envelope(owner: Owner, namespace: str) -> dict[str, Any]:
    """One whole-H100 binding that an H100 node satisfies, valid from yesterday."""
    return dated(with_profiles(owner, whole_h100_profile()), namespace)


@contextlib.contextmanager
def h100_stack(
    control_plane: ControlPlane,
    prefix: str,
    scheduling_timeout_seconds: int,
    *,
    gpus: int = 8,
    gpu_product: str | None = None,
) -> Iterator[TenantStack]:
    """The stack (`tenant_stack`) with the whole-H100 profile and one fake H100 node of its own,
    which the extender has seen before the first test runs; the node goes with the stack."""
    admin = control_plane.kube("admin")
    node = f"{prefix.removeprefix('tmi-')}-h100-{uuid.uuid4().hex[:4]}"
    extra: _NodeOverrides = {"gpu_product": gpu_product} if gpu_product else {}
    with tenant_stack(control_plane, prefix, whole_h100_envelope, scheduling_timeout_seconds) as up:
        create_fake_nodes(admin, [FakeNode(node, gpus=gpus, vram_gb=80, **extra)])
        assert up.extender is not None
        up.extender.wait_nodes([node])
        try:
            yield up
        finally:
            delete_fake_nodes(admin, [node])


@contextlib.contextmanager
def pod_names(control_plane: ControlPlane, stack: TenantStack) -> Iterator[Callable[..., str]]:
    """Unique Pod names `prefix-…`; each Pod named is deleted at the end."""
    names: list[str] = []

    def name(prefix: str = "tmi") -> str:
        names.append(f"{prefix}-{uuid.uuid4().hex[:6]}")
        return names[-1]

    try:
        yield name
    finally:
        admin = control_plane.kube("admin")
        for each in names:
            with contextlib.suppress(ApiError):
                admin.delete("v1", "Pod", each, stack.settings.namespace, grace_period_seconds=0)


def refusal(kube: Kube, pod: dict[str, Any]) -> ApiError:
    """The API server's refusal of a dry-run create (fails the test if it was admitted)."""
    try:
        kube.create(pod, dry_run=True)
    except ApiError as exc:
        return exc
    raise AssertionError(f"the API server admitted Pod {pod['metadata']['name']}")


def placed_and_verified(
    kube: Kube, stack: TenantStack, name: str, timeout: float = 90
) -> dict[str, Any]:
    """The Pod once it is bound and its AllocationVerified condition is True."""
    return kube.wait_for(
        "v1",
        "Pod",
        name,
        stack.settings.namespace,
        lambda p: (
            bool(p["spec"].get("nodeName"))
            and (condition(p, CONDITION) or {}).get("status") == "True"
        ),
        timeout=timeout,
        what=f"Pod {name} placed and verified",
    )
