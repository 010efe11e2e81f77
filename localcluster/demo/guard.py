"""First demo step: a real control plane, fake GPU nodes, and the pod guard at work.

``make demo`` runs ``python -m localcluster.demo.guard``: it starts the local
Kubernetes 1.36 control plane, creates fake NVIDIA nodes and prints them, applies the
tenant pod guard, shows the namespace installer being refused a privileged pod (and
a plain pod being admitted and scheduled onto a GPU node), then tears everything down.
"""

from __future__ import annotations

import sys
import time

from localcluster.__main__ import DEMO_NODES
from localcluster.nodes.kwok import create_fake_nodes, node_table
from localcluster.plane.binaries import BinariesMissingError
from localcluster.plane.controlplane import ControlPlane
from localcluster.plane.kube import pod_condition
from localcluster.servers.guard import apply_guard, dry_run_create, privileged_probe_pod

NAMESPACE = "kamiwaza"


def _step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def main() -> int:
    started = time.monotonic()
    _step("starting etcd, kube-apiserver, kube-scheduler and KWOK on 127.0.0.1")
    try:
        plane = ControlPlane.start()
    except BinariesMissingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with plane:
        print(f"API server {plane.server} up in {time.monotonic() - started:.1f}s")

        _step("fake GPU nodes (GPU Feature Discovery labels, device-plugin resources)")
        admin = plane.kube("admin")
        print(node_table(create_fake_nodes(admin, DEMO_NODES)))

        _step("applying manifests/guard (ValidatingAdmissionPolicies) and waiting for it")
        apply_guard(plane, NAMESPACE)
        plane.grant_namespace_admin("tmi-installer", NAMESPACE)
        installer = plane.kube("tmi-installer")
        print(f"user {plane.user('tmi-installer')!r} holds ClusterRole admin in {NAMESPACE} only")

        _step("installer creates a privileged, hostPID pod (server-side dry run)")
        err = dry_run_create(installer, privileged_probe_pod(NAMESPACE))
        if err is None:
            print("UNEXPECTED: the privileged pod was admitted", file=sys.stderr)
            return 1
        print(f"refused: HTTP {err.status} {err.reason}\n  {err.message}")

        _step("installer creates an ordinary pod asking for one GPU")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "demo-gpu-pod", "namespace": NAMESPACE},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.example/inference:1",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ]
            },
        }
        installer.create(pod)
        running = admin.wait_for(
            "v1",
            "Pod",
            "demo-gpu-pod",
            NAMESPACE,
            lambda p: p.get("status", {}).get("phase") == "Running",
            timeout=60,
        )
        print(
            f"admitted, scheduled onto {running['spec']['nodeName']}, "
            f"phase {running['status']['phase']}, Ready={pod_condition(running, 'Ready')}"
        )
        admin.delete("v1", "Pod", "demo-gpu-pod", NAMESPACE)

        _step("tearing down")
    print(f"done in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
