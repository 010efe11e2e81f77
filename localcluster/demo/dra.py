"""`make demo`, the DRA part: one engine deployment on a `dra` binding, end to end.

The owner signs a profile with one `dra` binding (examples/profile-envelope-dra.template.json,
the H200 of the recorded fixture) and renders its DeviceClass and claim templates with
`tmi render-dra`; the stack is installed with them; a KWOK node gets the device from an identity
playing NVIDIA's DRA driver; the tenant deploys, kube-scheduler allocates the claim from the
owner's class, and the controller checks the allocated device against the signed facts. A claim
the tenant writes itself on the driver's own class is refused.
"""

from __future__ import annotations

import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from localcluster.install.stack import deploy_stack
from localcluster.install.stack_settings import StackSettings
from localcluster.nodes.dra_driver import DRIVER, Driver, published_device
from localcluster.nodes.kwok import FakeNode, create_fake_nodes
from localcluster.plane.controlplane import ControlPlane
from localcluster.plane.kube import ApiError
from localcluster.servers.engine_pods import CONDITION, condition, engine_pod

NAMESPACE = "kamiwaza"
NODE = "gpu-dra-h200"
UUID = "GPU-9c156425-b68a-a03b-ec6b-53562cf93b1a"
WAIT = 90.0


def _step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _signed(work: Path, tmi: Any, examples: Path, image: str) -> tuple[dict[str, str], Any, Any]:
    """Key, signed DRA profile and `tmi render-dra`'s values, through the CLI."""
    key = work / "dra-owner.pem"
    _, identity = tmi("keygen", "--private-key-out", str(key))
    text = (examples / "profile-envelope-dra.template.json").read_text()
    envelope = json.loads(
        text.replace("<KEY_ID>", identity["keyId"]).replace("<LLAMACPP_CUDA_IMAGE>", image)
    )
    now = datetime.now(UTC).replace(microsecond=0)
    envelope["issuedAt"] = (now - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    envelope["expiresAt"] = (now + timedelta(days=365)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (work / "dra-envelope.json").write_text(json.dumps(envelope))
    _, configmap = tmi(
        "sign", "--envelope", str(work / "dra-envelope.json"), "--private-key", str(key)
    )
    (work / "dra-configmap.json").write_text(json.dumps(configmap))
    _, rendered = tmi(
        "render-dra",
        "--bundle",
        str(work / "dra-configmap.json"),
        "--owner-public-key",
        identity["publicKey"],
        "--cluster-binding-id",
        envelope["clusterBindingId"],
        "--namespace",
        NAMESPACE,
        "--format",
        "json",
    )
    return identity, configmap, rendered


def dra_story(tmi: Any, examples: Path, image: str, cluster: str) -> int:
    _step("a dra binding: signed, rendered by `tmi render-dra` into a DeviceClass and templates")
    with tempfile.TemporaryDirectory(prefix="tmi-demo-dra-") as tmp:
        identity, configmap, rendered = _signed(Path(tmp), tmi, examples, image)
    objects = rendered["owner"]["dra"][NAMESPACE]
    for device_class in objects["deviceClasses"]:
        print(f"DeviceClass {device_class['name']} (binding {device_class['binding']}):")
        print("  " + device_class["selector"].replace("\n", "\n  "))
    print(f"claim templates: {', '.join(t['name'] for t in objects['claimTemplates'])}")

    _step("the cluster, the stack with owner.dra, and the driver publishing one H200")
    started = time.monotonic()
    with ControlPlane.start() as plane:
        admin = plane.kube("admin")
        create_fake_nodes(admin, [FakeNode(NODE, gpus=0, vram_gb=None)])
        driver = Driver(plane)
        driver.publish(
            NODE,
            [
                published_device(
                    "gpu-0",
                    uuid=UUID,
                    product="NVIDIA H200",
                    driver="580.159.4",
                    memory="143771Mi",
                )
            ],
        )
        settings = StackSettings(
            owner_public_keys=(identity["publicKey"],),
            cluster_binding_id=cluster,
            scheduling_timeout_seconds=60,
        )
        with deploy_stack(plane, settings, configmap) as stack:
            assert stack.extender is not None
            stack.extender.wait_nodes([NODE])
            print(f"up in {time.monotonic() - started:.1f}s")
            plane.grant_namespace_admin("tmi-installer", NAMESPACE)
            installer = plane.kube("tmi-installer")
            _step(
                "tmi-installer deploys; kube-scheduler allocates the claim from the owner's class"
            )
            request = json.loads((examples / "request-qwen7b-gguf.json").read_text())
            pod = installer.create(engine_pod(NAMESPACE, request, name="qwen7b-dra"))
            name = pod["metadata"]["name"]
            claims = pod["spec"]["resourceClaims"]
            print(f"planned: resourceClaims {json.dumps(claims)}")

            def verified(p: dict[str, Any]) -> bool:
                found = condition(p, CONDITION)
                return bool(p["spec"].get("nodeName")) and (found or {}).get("status") == "True"

            try:
                pod = admin.wait_for("v1", "Pod", name, NAMESPACE, verified, timeout=WAIT)
            except TimeoutError as exc:
                print(f"UNEXPECTED: {exc}")
                return 1
            print(f"node {pod['spec']['nodeName']}")
            print(f"AllocationVerified True: {(condition(pod, CONDITION) or {}).get('message')}")

            _step("a claim on the driver's own class in the tenant namespace is refused, to anyone")
            claim = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "every-gpu", "namespace": NAMESPACE},
                "spec": {
                    "devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": DRIVER}}]}
                },
            }
            try:
                admin.create(claim, dry_run=True)
            except ApiError as exc:
                print(f"HTTP {exc.status}: {exc.message.rpartition('denied request: ')[2]}")
            else:
                print("UNEXPECTED: the claim was admitted")
                return 1
    return 0


__all__ = ["dra_story"]
