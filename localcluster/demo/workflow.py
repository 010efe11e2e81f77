"""`make demo`: the owner's workflow through the `tmi` CLI, then the same profile on a cluster.

The first half runs the owner tool as an owner would (a new key, the example envelope filled in
and signed, verified, and the example deployments planned) and prints the decisions as a table.
The second half publishes that very signed profile on the local control plane, on fake nodes
that carry what the profile attests (whole H200s, A100 MIG slices, an L40S shared through the
VRAM plugin, CPUs), brings the whole stack up (webhook, extender, the owner's scheduler,
controller), guards the namespace, and has the tenant's namespace admin deploy engine Pods: it
prints which were placed where with which grant and whether the grant was verified (the seed's
step 7 check), which were refused with which status and why, and which wait and why. Then it
tears everything down. Last (``localcluster.demo.node``), the same profile on a real node: the
chart's own Pods running there and one engine Pod seeing exactly the device it was allocated.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from localcluster.demo.dra import dra_story
from localcluster.demo.node import node_story
from localcluster.install.stack import (
    CONDITION,
    StackSettings,
    TenantStack,
    condition,
    deploy_stack,
    engine_pod,
    step7_row,
    table,
)
from localcluster.nodes.kwok import FakeNode, create_fake_nodes, node_table
from localcluster.plane.binaries import BinariesMissingError
from localcluster.plane.controlplane import ControlPlane
from localcluster.plane.kube import ApiError, Kube, pod_condition
from localcluster.plane.process import ComponentError, python_module
from localcluster.servers.guard import apply_guard, dry_run_create, privileged_probe_pod
from localcluster.servers.webhook import REQUEST_ANNOTATION

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TMI = python_module("tmi_cli")
CLUSTER = "demo-cluster"
NAMESPACE = "kamiwaza"
WAIT = 60.0

# What the example profile attests, node by node: GPU Feature Discovery's labels and the device
# plugins' resources agree with each binding (compute capability, CUDA driver major, memory).
DEMO_FLEET = (
    FakeNode(
        "gpu-h200-0",
        gpu_product="NVIDIA-H200",
        gpus=2,
        vram_gb=141,
        gpu_memory_mib=143771,
        compute_capability="9.0",
    ),
    FakeNode(
        "gpu-a100-mig-0",
        gpu_product="NVIDIA-A100-SXM4-80GB",
        gpus=1,
        whole_gpus=0,
        mig={"3g.40gb": 2},
        vram_gb=80,
        gpu_memory_mib=81920,
        compute_capability="8.0",
    ),
    FakeNode(
        "gpu-l40s-0",
        gpu_product="NVIDIA-L40S",
        gpus=1,
        whole_gpus=0,
        vram_gb=48,
        gpu_memory_mib=46068,
        vram_budget=True,
        compute_capability="8.9",
        cuda_driver_major=12,
        cuda_driver_minor=8,
        driver_version="570.86.15",
    ),
    FakeNode("cpu-0", gpus=0, vram_gb=None),
)


def _timestamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _tmi(*args: str, check: bool = True) -> tuple[int, Any]:
    result = subprocess.run([*TMI, *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise SystemExit(f"tmi {args[0]} failed: {result.stderr.strip()}")
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else None


def _catalog_image(engine: str, vendor: str, cuda: str) -> str:
    rows = subprocess.run([*TMI, "catalog"], capture_output=True, text=True, check=True).stdout
    for line in rows.splitlines():
        cells = line.split("\t")
        if cells[:4] == [engine, vendor, "amd64", cuda]:
            return cells[4]
    raise SystemExit(f"catalog has no {engine} {vendor} image")


def _short(image: str | None) -> str:
    if not image:
        return "-"
    repo, _, digest = image.partition("@")
    return f"{repo.rsplit('/', 1)[-1]}@{digest[7:19]}"


def _step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def owner_workflow(work: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """Key, signed profile, verification and plans through the CLI; the owner's public identity
    and the signed ConfigMap, for the cluster half."""
    print("== the owner: key, envelope, signature, verification", flush=True)
    key = work / "owner-ed25519-private.pem"
    _, identity = _tmi("keygen", "--private-key-out", str(key))
    print(f"keyId {identity['keyId']}")
    template = (EXAMPLES / "profile-envelope.template.json").read_text()
    envelope = json.loads(
        template.replace("<KEY_ID>", identity["keyId"])
        .replace("<LLAMACPP_CPU_IMAGE>", _catalog_image("llamacpp", "cpu", "-"))
        .replace("<LLAMACPP_CUDA_IMAGE>", _catalog_image("llamacpp", "nvidia", "13"))
    )
    # The servers on the cluster judge the window by the real clock, so the demo's profile is
    # issued now rather than on the template's dates.
    now = datetime.now(UTC).replace(microsecond=0)
    envelope["issuedAt"] = _timestamp(now - timedelta(days=1))
    envelope["expiresAt"] = _timestamp(now + timedelta(days=365))
    (work / "envelope.json").write_text(json.dumps(envelope, indent=2))
    at = _timestamp(now)
    _, configmap = _tmi(
        "sign", "--envelope", str(work / "envelope.json"), "--private-key", str(key), "--now", at
    )
    bundle = work / "profile-configmap.json"
    bundle.write_text(json.dumps(configmap))
    print(
        f"signed ConfigMap {configmap['metadata']['name']}, immutable, "
        f"bundle.sha256 {configmap['data']['bundle.sha256'][:16]}..."
    )
    common = [
        "--owner-public-key",
        identity["publicKey"],
        "--cluster-binding-id",
        CLUSTER,
        "--namespace",
        NAMESPACE,
        "--now",
        at,
    ]
    _, summary = _tmi("verify", "--bundle", str(bundle), *common)
    print(
        f"verified: version {summary['version']}, profiles "
        f"{', '.join(p['name'] for p in summary['profiles'])}"
    )

    print("\n== deployments planned by `tmi plan` (the webhook decides the same way)", flush=True)
    rows = [("request", "status", "path", "binding", "image", "grant / reason")]
    for path in sorted(EXAMPLES.glob("request-*.json")):
        _, body = _tmi(
            "plan", "--bundle", str(bundle), "--request", str(path), *common, check=False
        )
        if body["status"] == 200:
            grant = body.get("resources", {}).get("limits") or body.get("resources", {}).get(
                "requests", {}
            )
            rows.append(
                (
                    path.stem[8:],
                    "200",
                    body["path"],
                    body.get("bindingId") or "-",
                    _short(body.get("image")),
                    ",".join(f"{k}={v}" for k, v in grant.items()) or "-",
                )
            )
        else:
            rows.append((path.stem[8:], str(body["status"]), "-", "-", "-", body["detail"]))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:5])) + "  " + row[5])
    return identity, configmap


# -- the cluster ----------------------------------------------------------------------------------


def _requests() -> list[tuple[str, dict[str, Any]]]:
    """Every example request, a llama.cpp share of the L40S, and a second 70B that the H200s
    cannot hold while the first one runs."""
    found = [(p.stem[8:], json.loads(p.read_text())) for p in sorted(EXAMPLES.glob("request-*"))]
    share = json.loads((EXAMPLES / "request-qwen7b-gguf.json").read_text())
    share["inferenceResources"] = {
        "schemaVersion": 1,
        "accelerator": {
            "capability": "gpu",
            "count": 1,
            "memory": {"minimum": "8Gi"},
            "isolation": "accounted-share",
            "profile": "nvidia-vram-share",
        },
        "runtime": {"selection": "automatic"},
    }
    found.append(("qwen7b-gguf-on-share", share))
    again = json.loads((EXAMPLES / "request-llama70b-vllm.json").read_text())
    found.append(("llama70b-vllm-again", again))
    return found


def _deploy(installer: Kube, name: str, body: dict[str, Any]) -> str | tuple[int, str]:
    """Create the engine Pod; its name, or the refusal's HTTP status and detail."""
    pod = engine_pod(NAMESPACE, body, name=f"tmi-{uuid.uuid4().hex[:8]}", deployment_id=name)
    try:
        installer.create(pod)
    except ApiError as exc:
        detail = exc.message.partition("denied the request: ")[2] or exc.message
        return exc.status, detail
    return str(pod["metadata"]["name"])


def _settled(pod: dict[str, Any]) -> bool:
    """Placed and judged by the controller (Ready follows a True verdict), or Pending with the
    scheduler's reason."""
    if pod["spec"].get("nodeName"):
        verdict = (condition(pod, CONDITION) or {}).get("status")
        return verdict == "False" or (verdict == "True" and pod_condition(pod, "Ready") == "True")
    return (condition(pod, "PodScheduled") or {}).get("reason") == "Unschedulable"


def cluster_story(identity: dict[str, str], configmap: dict[str, Any]) -> int:
    _step("the cluster: etcd, kube-apiserver, kube-scheduler and KWOK on 127.0.0.1")
    started = time.monotonic()
    try:
        plane = ControlPlane.start()
    except BinariesMissingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with plane:
        print(f"API server {plane.server} up in {time.monotonic() - started:.1f}s")
        admin = plane.kube("admin")
        _step("fake nodes carrying what the profile attests (GFD labels, device-plugin resources)")
        print(node_table(create_fake_nodes(admin, DEMO_FLEET)))

        _step("the stack: webhook, extender, kamiwaza-inference-scheduler, controller x2")
        settings = StackSettings(
            owner_public_keys=(identity["publicKey"],), cluster_binding_id=CLUSTER
        )
        begun = time.monotonic()
        with deploy_stack(plane, settings, configmap) as stack:
            _describe(stack, time.monotonic() - begun)
            assert stack.extender is not None
            stack.extender.wait_nodes(n.name for n in DEMO_FLEET)
            return _tenant_story(plane, stack)


def _describe(stack: TenantStack, seconds: float) -> None:
    assert stack.extender is not None and stack.controller is not None
    print(
        f"profile {stack.profile['metadata']['name']} (version {stack.verified.version}) "
        f"published in {NAMESPACE}; the webhook plans with it"
    )
    print(f"webhook    {stack.webhook.url if stack.webhook else '-'} (the owner's configuration)")
    print(f"extender   {stack.extender.url} (HTTPS, not ignorable), for every engine Pod")
    print(f"scheduler  {stack.settings.scheduler_name}, configuration from render-scheduler-config")
    print(
        f"controller {len(stack.controller.replicas)} replicas, leader {stack.controller.leader()}"
    )
    print(f"up in {seconds:.1f}s")


def _tenant_story(plane: ControlPlane, stack: TenantStack) -> int:
    admin = plane.kube("admin")
    _step(f"the pod guard on {NAMESPACE}, and its namespace admin")
    apply_guard(plane, NAMESPACE)
    plane.grant_namespace_admin("tmi-installer", NAMESPACE)
    installer = plane.kube("tmi-installer")
    refused = dry_run_create(installer, privileged_probe_pod(NAMESPACE))
    if refused is None:
        print("UNEXPECTED: a privileged pod was admitted", file=sys.stderr)
        return 1
    why = refused.message.rpartition("denied request: ")[2]
    print(f"privileged hostPID pod: HTTP {refused.status} {refused.reason}: {why}")

    _step("tmi-installer deploys engine Pods (label kamiwaza.ai/deployment-id, request annotation)")
    created: dict[str, str] = {}
    refusals: list[tuple[str, str, str]] = [("request", "HTTP", "detail")]
    for name, body in _requests():
        outcome = _deploy(installer, name, body)
        if isinstance(outcome, str):
            created[outcome] = name
        else:
            refusals.append((name, str(outcome[0]), outcome[1]))
    pods: dict[str, dict[str, Any]] = {}
    for pod_name in created:
        try:
            pods[pod_name] = admin.wait_for(
                "v1", "Pod", pod_name, NAMESPACE, _settled, timeout=WAIT
            )
        except TimeoutError as exc:
            print(f"UNEXPECTED: {exc}", file=sys.stderr)
            return 1

    rows = [("request", "pod", "node", "runtimeClass", "granted", "AllocationVerified", "Ready")]
    waiting: list[tuple[str, str]] = []
    for pod_name, pod in pods.items():
        row = step7_row(pod)
        rows.append((created[pod_name], *row, pod_condition(pod, "Ready") or "-"))
        if row[1] == "-":
            message = (condition(pod, "PodScheduled") or {}).get("message", "")
            waiting.append((f"{created[pod_name]} ({pod_name})", str(message)))
    print(table(rows))

    _step("refused at admission (the webhook's status and the seed's detail)")
    print(table(refusals))
    if waiting:
        _step("waiting (kube-scheduler's reason; the controller reports it at its deadline)")
        for who, message in waiting:
            print(f"{who}: {message}")
    verified = [
        n for n, p in pods.items() if (condition(p, CONDITION) or {}).get("status") == "True"
    ]
    placed = [n for n, p in pods.items() if p["spec"].get("nodeName")]
    if not placed or verified != placed:
        print("UNEXPECTED: a placed Pod is not verified", file=sys.stderr)
        return 1
    target = next(n for n in placed if created[n] == "qwen7b-gguf")
    return _tamper(plane, created, target)


def _tamper(plane: ControlPlane, created: dict[str, str], pod_name: str) -> int:
    """Readiness alone is not proof: a grant the Pod's records no longer support is reported."""
    _step(f"tmi-installer rewrites the deployment request of {pod_name} to the 70B one")
    forged = json.loads((EXAMPLES / "request-llama70b-vllm.json").read_text())
    plane.kube("tmi-installer").request(
        "PATCH",
        f"/api/v1/namespaces/{NAMESPACE}/pods/{pod_name}",
        body={"metadata": {"annotations": {REQUEST_ANNOTATION: json.dumps(forged)}}},
        content_type="application/merge-patch+json",
    )

    def judged(pod: dict[str, Any]) -> bool:
        verdict = (condition(pod, CONDITION) or {}).get("status")
        return verdict == "False" and pod_condition(pod, "Ready") == "False"

    pod = plane.kube("admin").wait_for("v1", "Pod", pod_name, NAMESPACE, judged, timeout=WAIT)
    verdict = condition(pod, CONDITION) or {}
    rows = [
        ("request", "pod", "AllocationVerified", "reason", "Ready"),
        (created[pod_name], pod_name, "False", str(verdict.get("reason")), "False"),
    ]
    print(table(rows))
    print(f"message: {verdict.get('message')}")
    _step("tearing down")
    return 0


def main() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tmi-demo-") as tmp:
        identity, configmap = owner_workflow(Path(tmp))
    try:
        status = cluster_story(identity, configmap)
        if status == 0:
            status = dra_story(_tmi, EXAMPLES, _catalog_image("llamacpp", "nvidia", "13"), CLUSTER)
        if status == 0:
            status = node_story(identity, configmap, CLUSTER, EXAMPLES)
    except ComponentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"done in {time.monotonic() - started:.1f}s")
    return status


if __name__ == "__main__":
    sys.exit(main())
