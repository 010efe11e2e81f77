"""DRA engine Pods scheduled through the real kube-scheduler, beside the extender path.

One local control plane (etcd, kube-apiserver, kube-controller-manager, KWOK) holds two fleets
of the same size in devices: KWOK nodes whose GPUs a test identity publishes as NVIDIA's DRA
driver would (ResourceSlices of 8 devices a node, `localcluster.nodes.dra_driver`), and KWOK nodes
advertising `nvidia.com/gpu` with GPU Feature Discovery's labels. The signed profile has a
`dra` binding for the first and a device-plugin binding for the second; the owner's DeviceClass
and claim templates are the core's (`inference_policy.trust.dra_claims`). Three runs per size, in
rotating order, each creating its Pods before the scheduler starts (the window is first to
last binding, as `bench_scheduling` measures it, whose run loop this uses):

* `dra_with_extender`: DRA engine Pods, the owner's scheduler configuration with the tmi
  extender (`tmi render-scheduler-config`), the claims made by the resource-claim controller
  from the owner's template and allocated by the scheduler's DynamicResources plugin;
* `dra_without_extender`: the same Pods and scheduler without the extender: the same
  scheduler's DRA figure without tmi;
* `dra_with_constant_extender`: the same Pods and scheduler with a constant extender in the tmi
  extender's place (`bench/constant_extender.py`: every node passes, none is scored), so the
  cost of consulting any HTTP extender is told apart from what tmi's adds to it;
* `extender_path`: device-plugin engine Pods through the tmi extender, on the other fleet.

Sizes: 500 devices by default (63 nodes per fleet, about four minutes); `--sizes 500 5000`
adds 5,000 (625 nodes per fleet). The target is `tmi`'s extender against the constant one in the
same runs, at least 0.85 of its rate: what `tmi`'s own work costs a DRA Pod beyond any HTTP
extender's round trip. Upstream's scheduler_perf DRA claim-template tests run at 51-81 Pods/s at
500 nodes on CI machines. Needs the control-plane binaries (`make controlplane`). Run:
`.venv/bin/python bench/bench_dra.py [--sizes 500 5000]`. Writes bench/results/dra.json after
each repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # the checkout, for a script run by path
sys.path.append(str(ROOT / "bench"))

from scheduling_run import (  # noqa: E402
    APISERVER_ARGS,
    PROFILE_CONFIGMAP,
    clear,
    grant_extender,
    run,
    start_constant_extender,
    start_extender,
)

from inference_policy.base.wire import ENGINE_LABEL  # noqa: E402
from inference_policy.placing.schedconfig import render_scheduler_config  # noqa: E402
from inference_policy.trust.dra_claims import (  # noqa: E402
    claimed_bindings,
    device_class_object,
    published_templates,
    template_object,
)
from inference_policy.trust.profile import parse_envelope  # noqa: E402
from kits.extenderkit import block, plan_for, planned_pod, request  # noqa: E402
from kits.fleetkit import h100  # noqa: E402
from kits.profilekit import (  # noqa: E402
    NAMESPACE,
    Owner,
    dra_binding,
    gpu_binding,
    gpu_profile,
    with_profiles,
)
from localcluster import ControlPlane, FakeNode, create_fake_nodes  # noqa: E402
from localcluster.nodes.dra_driver import Driver, published_device  # noqa: E402
from localcluster.plane.process import free_port, wait_until  # noqa: E402
from localcluster.servers.webhook import apply_runtime_class  # noqa: E402

# 500 devices by default (about four minutes); `--sizes 500 5000` adds the larger fleet.
SIZES = (500,)
GPUS_PER_NODE = 8
PODS = 300
REPEATS = 3
OTHER_NAMESPACE = "bench-dra-other"
RESULTS = ROOT / "bench" / "results" / "dra.json"
# `tmi`'s extender against a constant one in the same scheduler: what `tmi`'s own work costs a
# DRA Pod over any HTTP extender's round trip.
TARGET_VS_CONSTANT = 0.85


def envelope_of(owner: Owner) -> dict[str, Any]:
    whole = gpu_binding("h100-whole", cc="9.0", memory="79Gi", features=["bf16", "p2p"])
    dra = dra_binding("h100-dra")
    return with_profiles(
        owner,
        gpu_profile("nvidia-whole", "whole-device", [whole]),
        gpu_profile("nvidia-dra", "whole-device", [dra]),
    )


def _pods(
    owner: Owner, envelope: dict[str, Any], profile: str, run: str, namespace: str
) -> list[dict[str, Any]]:
    plan = plan_for(owner, envelope, request(inferenceResources=block(profile)))
    pods = []
    for i in range(PODS):
        pod = planned_pod(plan, name=f"{run}-{profile.split('-')[1]}-{i:03d}")
        pod["apiVersion"], pod["kind"] = "v1", "Pod"
        del pod["metadata"]["uid"]
        del pod["status"]
        pod["metadata"]["labels"] = {ENGINE_LABEL: f"{run}-{i:03d}"}
        pod["metadata"]["namespace"] = namespace
        pods.append(pod)
    return pods


def _fleets(plane: ControlPlane, driver: Driver, devices: int, size_tag: str) -> int:
    nodes = devices // GPUS_PER_NODE + (1 if devices % GPUS_PER_NODE else 0)
    admin = plane.kube("admin")
    dra_nodes = [FakeNode(f"dra-{size_tag}-{i:04d}", gpus=0, vram_gb=None) for i in range(nodes)]
    create_fake_nodes(admin, dra_nodes)
    for index, node in enumerate(dra_nodes):
        driver.publish(
            node.name,
            [
                published_device(f"gpu-{g}", uuid=f"GPU-{index:08x}-0000-0000-0000-{g:012d}")
                for g in range(GPUS_PER_NODE)
            ],
        )
    create_fake_nodes(
        admin, [h100(f"plugin-{size_tag}-{i:04d}", gpus=GPUS_PER_NODE) for i in range(nodes)]
    )
    return nodes


def _clear_claims(plane: ControlPlane) -> None:
    kube = plane.kube("admin")

    def gone() -> bool:
        return not any(
            kube.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")["items"]
            for ns in (NAMESPACE, OTHER_NAMESPACE)
        )

    wait_until(gone, timeout=120, what="resource claims to be gone")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), metavar="DEVICES")
    sizes = tuple(parser.parse_args().sizes)
    owner = Owner()
    envelope = envelope_of(owner)
    configmap = owner.sign(envelope, name=PROFILE_CONFIGMAP)
    parsed = parse_envelope(envelope)
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
        "load_average_1m_before": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "pods_per_run": PODS,
        "repeats": REPEATS,
        "sizes": {},
    }
    plane = ControlPlane.start(start_scheduler=False, apiserver_args=APISERVER_ARGS)
    extender: subprocess.Popen[bytes] | None = None
    constant: subprocess.Popen[bytes] | None = None
    try:
        admin = plane.kube("admin")
        plane.create_namespace(NAMESPACE)
        plane.create_namespace(OTHER_NAMESPACE)
        apply_runtime_class(plane, "nvidia")
        admin.create({**configmap, "metadata": {**configmap["metadata"]}})
        for _, binding in claimed_bindings(parsed):
            admin.apply(device_class_object(binding))
        for template in published_templates(parsed):
            for ns in (NAMESPACE, OTHER_NAMESPACE):
                admin.apply(template_object(template, ns))
        grant_extender(plane)
        driver = Driver(plane)
        port = free_port()
        extender = start_extender(plane, owner, port)
        config = render_scheduler_config(extender_url=f"http://127.0.0.1:{port}")
        config["leaderElection"] = {"leaderElect": False}
        config["clientConnection"] = {"qps": 1000, "burst": 2000}
        without = {k: v for k, v in config.items() if k != "extenders"}
        constant_port = free_port()
        constant = start_constant_extender(plane, constant_port)
        constant_config = {
            **config,
            "extenders": [
                {**config["extenders"][0], "urlPrefix": f"http://127.0.0.1:{constant_port}"}
            ],
        }
        modes = (
            ("dra_with_extender", "nvidia-dra", config, extender.pid, NAMESPACE),
            ("dra_without_extender", "nvidia-dra", without, None, OTHER_NAMESPACE),
            (
                "dra_with_constant_extender",
                "nvidia-dra",
                constant_config,
                constant.pid,
                OTHER_NAMESPACE,
            ),
            ("extender_path", "nvidia-whole", config, extender.pid, NAMESPACE),
        )
        # Each size adds its fleets to the last: the 5,000-device runs see both sizes' nodes
        # of the other kind too, as a mixed cluster would.
        total_devices = 0
        for devices in sizes:
            nodes = _fleets(plane, driver, devices, f"s{devices}")
            total_devices += nodes * GPUS_PER_NODE
            runs: dict[str, list[dict[str, Any]]] = {label: [] for label, *_ in modes}
            for repeat in range(REPEATS):
                shift = repeat % len(modes)
                for label, profile, cfg, pid, ns in modes[shift:] + modes[:shift]:
                    run_name = f"{label.replace('_', '')}{devices}r{repeat}"
                    pods = _pods(owner, envelope, profile, run_name, ns)
                    run_ = run(plane, pods, label, cfg, pid)
                    clear(plane, pods)
                    _clear_claims(plane)
                    runs[label].append(
                        {
                            "pods_per_second": run_["pods_per_second"],
                            "bound": run_["bound"],
                            "algorithm_ms": run_["scheduler_cycle"].get("algorithm_ms"),
                            "machine_cpu_ms_per_pod": run_["machine_cpu_ms_per_pod"],
                            "extender_cpu_ms_per_pod": run_["extender_cpu_ms_per_pod"],
                        }
                    )
                    print(label, devices, run_["pods_per_second"], flush=True)
                results["sizes"][str(devices)] = _summary(runs, nodes, total_devices, repeat + 1)
                _write(results)
    finally:
        for server in (extender, constant):
            if server is not None:
                server.terminate()
                server.wait(15)
        plane.stop()
    print(RESULTS.read_text())


def _summary(
    runs: dict[str, list[dict[str, Any]]], nodes: int, total_devices: int, repeats: int
) -> dict[str, Any]:
    """One size's figures over the repeats done so far."""
    summary: dict[str, Any] = {}
    for label, values in runs.items():
        rates = sorted(v["pods_per_second"] for v in values)
        latencies = sorted(v["algorithm_ms"] or 0.0 for v in values)
        summary[label] = {
            "median_pods_per_second": rates[len(rates) // 2],
            "median_algorithm_ms": latencies[len(latencies) // 2],
            "runs": values,
        }
    summary["nodes_per_fleet"] = nodes
    summary["date"] = datetime.now(UTC).strftime("%Y-%m-%d")
    summary["repeats_done"] = repeats
    summary["load_average_1m"] = round(os.getloadavg()[0], 2)
    summary["dra_devices_published"] = total_devices
    rate = {label: summary[label]["median_pods_per_second"] for label in runs}
    summary["dra_with_vs_without_extender"] = round(
        rate["dra_with_extender"] / rate["dra_without_extender"], 3
    )
    summary["dra_constant_vs_without_extender"] = round(
        rate["dra_with_constant_extender"] / rate["dra_without_extender"], 3
    )
    ratio = round(rate["dra_with_extender"] / rate["dra_with_constant_extender"], 3)
    summary["dra_with_vs_constant_extender"] = ratio
    summary["target_with_vs_constant"] = TARGET_VS_CONSTANT
    summary["met"] = ratio >= TARGET_VS_CONSTANT
    return summary


def _write(results: dict[str, Any]) -> None:
    """The figures so far; a run of some sizes keeps the others' last figures (each size's
    runs are one run)."""
    out = dict(results)
    if RESULTS.is_file():
        earlier = json.loads(RESULTS.read_text()).get("sizes", {})
        out["sizes"] = {**earlier, **results["sizes"]}
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
