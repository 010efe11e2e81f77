"""Spill across device-plugin bindings end to end: the MIG slices full, the next deployment is
planned on, and placed on, the L40S share.

The profile has two bindings a 7B GGUF fits: an A100 `3g.40gb` MIG slice (38Gi, the smaller,
which the planner takes first) and an L40S accounted VRAM share (44Gi). The owner's extender,
which sees the nodes, writes each binding's free room into ConfigMap `tmi-binding-room` in the
tenant namespace (under the chart's Role); the tenant's webhook reads it by name and plans the
smallest binding with room, recording the choice; the extender's grant check and the allocation
controller replay that choice. Without the figures both Pods would ask for the one slice and the
second would wait Pending while the share had room. The DRA half (a claim's `firstAvailable`
sub-requests) is `tests/e2e/scheduling/test_dra.py` and `tests/e2e/scheduling/test_spill_dra.py`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from inference_policy.planning.room import ROOM_CONFIGMAP, ROOM_KEY, WITH_ROOM, parse_figures
from kits.fleetkit import a100_mig, l40s
from kits.profilekit import Owner, gpu_binding, gpu_profile, request, with_profiles
from kits.stackkit import dated, placed_and_verified, pod_names, tenant_stack
from localcluster import ApiError, ControlPlane, Kube, create_fake_nodes
from localcluster.install.stack import CONDITION, TenantStack, condition, engine_pod
from localcluster.nodes.kwok import delete_fake_nodes

pytestmark = pytest.mark.e2e

MIG = "mig-3g40gb-amd64"
SHARE = "vram-l40s-amd64"
MIG_RESOURCE = "nvidia.com/mig-3g.40gb"
VRAM = "kamiwaza.ai/vram-gb-gpu-0"
SMALL = request("llamacpp")


def spill_envelope(owner: Owner, namespace: str) -> dict[str, Any]:
    mig = gpu_binding(MIG, cc="8.0", memory="38Gi", resource=MIG_RESOURCE, features=["bf16", "mig"])
    share = gpu_binding(
        SHARE, allocator="vram-plugin", resource=VRAM, cc="8.9", cuda=12, memory="44Gi"
    )
    envelope = with_profiles(
        owner,
        gpu_profile("nvidia-mig-3g40gb", "mig", [mig]),
        gpu_profile("nvidia-vram-share", "accounted-share", [share]),
    )
    return dated(envelope, namespace)


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane) -> Iterator[TenantStack]:
    with tenant_stack(control_plane, "tmi-spill", spill_envelope, 30) as up:
        yield up


@pytest.fixture(scope="module")
def nodes(control_plane: ControlPlane, stack: TenantStack) -> Iterator[dict[str, str]]:
    """One A100 with one 3g.40gb slice, one L40S with its 48 GB VRAM budget."""
    admin = control_plane.kube("admin")
    suffix = uuid.uuid4().hex[:4]
    names = {"mig": f"spill-a100-{suffix}", "share": f"spill-l40s-{suffix}"}
    create_fake_nodes(admin, [a100_mig(names["mig"], gpus=1, slices=1), l40s(names["share"])])
    assert stack.extender is not None
    stack.extender.wait_nodes(list(names.values()))
    try:
        yield names
    finally:
        delete_fake_nodes(admin, list(names.values()))


def _room(kube: Kube, stack: TenantStack) -> dict[str, tuple[int, int]] | None:
    try:
        configmap = kube.get("v1", "ConfigMap", ROOM_CONFIGMAP, stack.settings.namespace)
    except ApiError:
        return None
    figures = parse_figures(configmap["data"][ROOM_KEY])
    if figures.bundle != stack.verified.sha256:
        return None
    return {k: (v.free, v.largestOnNode) for k, v in figures.bindings.items()}


def _wait_room(kube: Kube, stack: TenantStack, want: dict[str, tuple[int, int]]) -> None:
    kube.wait_for(
        "v1",
        "Namespace",
        stack.settings.namespace,
        None,
        lambda _: _room(kube, stack) == want,
        timeout=60,
        what=f"room figures {want}",
    )


def _plan(pod: dict[str, Any]) -> dict[str, Any]:
    plan: dict[str, Any] = json.loads(pod["metadata"]["annotations"]["kamiwaza.ai/plan"])
    return plan


def test_with_the_mig_slices_full_the_next_deployment_is_placed_on_the_share(
    control_plane: ControlPlane, stack: TenantStack, nodes: dict[str, str]
) -> None:
    admin = control_plane.kube("admin")
    installer = control_plane.kube("tmi-installer")
    namespace = stack.settings.namespace
    # The extender publishes what the nodes hold: one slice, 48 GB of L40S budget.
    _wait_room(admin, stack, {MIG: (1, 1), SHARE: (48, 48)})
    with pod_names(control_plane, stack) as unique:
        first = unique("first")
        installer.create(engine_pod(namespace, SMALL, name=first))
        pod = placed_and_verified(admin, stack, first)
        assert (pod["spec"]["nodeName"], _plan(pod)["bindingId"]) == (nodes["mig"], MIG)
        assert _plan(pod)["choice"] == {"rule": WITH_ROOM, "passed": []}
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {MIG_RESOURCE: "1"}

        # The slice is taken; once the figures say so, the next replica spills to the share.
        _wait_room(admin, stack, {MIG: (0, 0), SHARE: (48, 48)})
        second = unique("second")
        installer.create(engine_pod(namespace, SMALL, name=second))
        pod = placed_and_verified(admin, stack, second)
        plan = _plan(pod)
        assert (pod["spec"]["nodeName"], plan["bindingId"]) == (nodes["share"], SHARE)
        assert plan["choice"] == {"rule": WITH_ROOM, "passed": [MIG]}
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert set(limits) == {VRAM} and int(limits[VRAM]) <= 44
        verdict = condition(pod, CONDITION)
        assert verdict is not None and verdict["reason"] == "Verified"


def test_figures_the_tenant_writes_steer_only_among_the_bindings_its_request_may_use(
    control_plane: ControlPlane, stack: TenantStack, nodes: dict[str, str]
) -> None:
    """The figures live in the tenant's namespace, so its admin may write them (threat model
    row 17). The most that buys is another binding its request is granted anyway: figures that
    call the slice full send the Pod to the share, and room on a binding the profile does not
    grant this request (or does not have) is never taken. The Pod is placed and verified, since
    the plan is the core's for the recorded choice."""
    admin = control_plane.kube("admin")
    installer = control_plane.kube("tmi-installer")
    namespace = stack.settings.namespace
    _wait_room(admin, stack, {MIG: (1, 1), SHARE: (48, 48)})
    figures = {
        "schemaVersion": 1,
        "bundle": stack.verified.sha256,
        "observedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "bindings": {
            MIG: {"free": 0, "largestOnNode": 0},
            SHARE: {"free": 48, "largestOnNode": 48},
            "whole-h100-amd64": {"free": 8, "largestOnNode": 8},
        },
    }
    installer.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": ROOM_CONFIGMAP, "namespace": namespace},
            "data": {ROOM_KEY: json.dumps(figures)},
        }
    )
    with pod_names(control_plane, stack) as unique:
        name = unique("steered")
        # Once the webhook has read them (a dry run shows it without creating anything).
        admin.wait_for(
            "v1",
            "Namespace",
            namespace,
            None,
            lambda _: (
                _plan(installer.create(engine_pod(namespace, SMALL, name=name), dry_run=True))[
                    "bindingId"
                ]
                == SHARE
            ),
            timeout=30,
            what="the webhook to plan with the tenant's figures",
        )
        installer.create(engine_pod(namespace, SMALL, name=name))
        pod = placed_and_verified(admin, stack, name)
        plan = _plan(pod)
        assert (pod["spec"]["nodeName"], plan["bindingId"]) == (nodes["share"], SHARE)
        assert plan["choice"] == {"rule": WITH_ROOM, "passed": [MIG]}
