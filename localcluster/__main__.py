"""``python -m localcluster``: bring the local control plane up for manual debugging.

Starts etcd, kube-apiserver, KWOK and the default scheduler, creates a few fake GPU
nodes, prints the admin kubeconfig path and the component logs, and keeps everything
running until Ctrl-C, then tears it down.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from localcluster.nodes.kwok import FakeNode, create_fake_nodes, node_table
from localcluster.plane.binaries import BinariesMissingError
from localcluster.plane.controlplane import ControlPlane

DEMO_NODES = (
    FakeNode("gpu-h100-0", gpus=4, vram_gb=80, gpu_memory_mib=81559, vram_budget=True),
    FakeNode(
        "gpu-a100-mig-0",
        gpu_product="NVIDIA-A100-SXM4-80GB",
        gpus=2,
        whole_gpus=0,
        mig={"3g.40gb": 2, "1g.10gb": 6},
        vram_gb=80,
        gpu_memory_mib=81920,
        compute_capability="8.0",
    ),
    FakeNode(
        "gpu-gh200-0",
        arch="arm64",
        gpu_product="NVIDIA-GH200-480GB",
        gpus=1,
        vram_gb=96,
        gpu_memory_mib=97871,
        cpu="72",
        memory="480Gi",
    ),
    FakeNode("cpu-0", gpus=0, vram_gb=None),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__)
    parser.add_argument("--workdir", type=Path, help="keep state and logs here (default: temp)")
    parser.add_argument("--no-nodes", action="store_true", help="do not create fake nodes")
    args = parser.parse_args(argv)
    try:
        plane = ControlPlane.start(args.workdir)
    except BinariesMissingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with plane:
        if not args.no_nodes:
            nodes = create_fake_nodes(plane.kube("admin"), DEMO_NODES)
            print(node_table(nodes))
            print()
        print(f"API server:  {plane.server}")
        print(f"kubeconfig:  {plane.kubeconfig('admin')}")
        print(f"  e.g. KUBECONFIG={plane.kubeconfig('admin')} kubectl get nodes")
        for name, path in plane.log_files().items():
            print(f"log {name:<24} {path}")
        print("Ctrl-C to stop.", flush=True)
        try:
            while True:
                plane.check_alive()
                time.sleep(2)
        except KeyboardInterrupt:
            print("\nstopping...", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
