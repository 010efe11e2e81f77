"""`tmi` beside HAMi (v2.10) on one local control plane: the same fleet, the same engine Pods,
measured side by side in one run, interleaved.

A cluster owner choosing a GPU admission and scheduling layer compares `tmi` with HAMi, the
webhook and scheduler extender they would pick instead. Both run here as their installs do:

* `tmi`: its webhook (the plan API, behind the owner's MutatingWebhookConfiguration and
  admission policies, for the tenant namespace) and its extender (filter and prioritize),
  called by a stock kube-scheduler (v1.36) with the configuration `tmi render-scheduler-config`
  renders; kube-scheduler binds.
* HAMi: its scheduler binary built from its source (`tools/hami/build.sh`, on demand; nothing in
  `make test` needs it), serving its webhook and its extender (filter and bind) in one process,
  called by a stock kube-scheduler with the configuration HAMi's chart renders (helm, from
  HAMi's source), its webhook configuration the chart's; `hami_peer.py` says how its device
  plugin's part is stood in for.

The fleet (KWOK nodes) carries both systems' facts on the same nodes: GPU Feature Discovery's
labels and the device plugins' resources that `tmi`'s signed bindings are checked against, and
the device registration HAMi's device plugin writes. H100 nodes (8 GPUs) serve whole GPUs, L40S
nodes (one 48 GB card, an accounted VRAM bucket for `tmi`) serve shares. The arrivals are one
seeded stream of engine Pods: whole-GPU Pods of 1, 2 and 4 GPUs and shares of 8, 16 and 24 GB,
in two streams each repeat: one that fits (every Pod binds: throughput, latency and CPU are
the scheduling alone) and one with more than the fleet holds (packing decides how many are
placed; its throughput also counts the retries of Pods that wait). `tmi`'s Pods are the
platform's (a deployment request, each its own deployment) planned by its webhook; HAMi's ask
for the same in HAMi's names: `nvidia.com/gpu` N (whole: no memory named, so each device's
memory is all taken) or `nvidia.com/gpu` 1 with `nvidia.com/gpumem` the share in MiB, pinned to
the model by `nvidia.com/use-gputype` as `tmi`'s binding pins it by GFD labels. HAMi's L40S is
registered with 48 x 1024 MiB so both see the same capacity in their units.

Each repeat creates the stream's Pods one at a time, rotating between `tmi`'s namespace,
HAMi's, the constant-answer webhook's (the floor of a webhook written as `tmi`'s is) and a
namespace no webhook serves: the Pod-create latency through each webhook. Then each system's
scheduler runs alone on its own Pods, the order alternating between repeats (each system's
Pods are deleted before the other's run: kube-scheduler counts the `nvidia.com/gpu` of every
bound Pod, HAMi's included, which HAMi's own configuration tells its scheduler to ignore). Of
each run: from the first binding to the last (throughput), the scheduler's mean algorithm and
attempt time per Pod (latency), each extender process's CPU per Pod bound and the scheduler's,
and, once nothing is left to try, the Pods placed and the GPUs stranded: free capacity that no
Pod left waiting could use (a whole-GPU node's free GPUs fewer than the smallest whole Pod
waiting; a card's free memory less than the smallest share waiting; in GPUs). Memory: each
process's resident size, and its peak, at the end.

Where the two do different work: HAMi's extender binds (kube-scheduler's default binder binds
`tmi`'s Pods, so its CPU is in kube-scheduler's figure for `tmi`, in HAMi's for HAMi; both are
reported, and their sum), takes a node lock per Pod and picks the device within the node (its
annotations name it); `tmi`'s extender checks each Pod's plan against the signed profile and
each node's facts against the binding, and leaves the device to the device plugin. HAMi's
webhook only sets the scheduler's name; `tmi`'s plans the Pod. Both are in the figures as
they are.

Needs the control-plane binaries (`make controlplane`) and Go (HAMi is built on first use:
`tools/hami/build.sh [SOURCE_DIR]`, $HAMI_SRC for a local checkout). Run:
`.venv/bin/python bench/bench_peer.py [--repeats 3]`. Writes bench/results/peer.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.append(str(ROOT))  # the checkout, for a script run by path

import hami_peer  # noqa: E402
from constant_pair import NAMESPACES, ConstantWebhook  # noqa: E402
from constant_pair import create_namespaces as _namespaces  # noqa: E402
from constant_pair import engine as _engine  # noqa: E402
from hami_peer import Card, DevicePluginStandIn, Hami  # noqa: E402
from peer_measure import clear, memory_of, schedule_run, stranded, summary  # noqa: E402
from scheduling_run import APISERVER_ARGS  # noqa: E402
from scheduling_run import grant_extender as _grant_extender  # noqa: E402
from scheduling_run import start_extender as _start_extender  # noqa: E402

from inference_policy.base.wire import ENGINE_LABEL  # noqa: E402
from inference_policy.placing.schedconfig import render_scheduler_config  # noqa: E402
from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME  # noqa: E402
from kits.extenderkit import SHARE, VRAM, WHOLE, block  # noqa: E402
from kits.fleetkit import h100, l40s  # noqa: E402
from kits.profilekit import (  # noqa: E402
    CLUSTER,
    NAMESPACE,
    Owner,
    gpu_binding,
    gpu_profile,
    request,
    with_profiles,
)
from kits.webhookkit import engine_pod  # noqa: E402
from localcluster import ControlPlane, create_fake_nodes, versions  # noqa: E402
from localcluster.plane.process import free_port  # noqa: E402
from localcluster.servers.webhook import WebhookSettings, deploy_webhook, is_planned  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "peer.json"
H100_NODES = 16
L40S_NODES = 32
H100 = Card("NVIDIA H100 80GB HBM3", 81559)
L40S = Card("NVIDIA L40S", 48 * 1024)
# (kind, GPUs, share GB, how many) of each stream. "fits": 88 of the 128 whole GPUs and 800 of
# the 1,536 GB of shares, so every Pod binds and the run times scheduling alone. "overfull":
# 160 GPUs of whole Pods and 1,440 GB of shares, more than the fleet holds, so packing decides
# how many are placed.
STREAMS = {
    "fits": (
        ("whole", 1, 0, 40),
        ("whole", 2, 0, 12),
        ("whole", 4, 0, 6),
        ("share", 1, 8, 40),
        ("share", 1, 16, 15),
        ("share", 1, 24, 10),
    ),
    "overfull": (
        ("whole", 1, 0, 64),
        ("whole", 2, 0, 24),
        ("whole", 4, 0, 12),
        ("share", 1, 8, 60),
        ("share", 1, 16, 30),
        ("share", 1, 24, 20),
    ),
}
NONE_NAMESPACE = NAMESPACES["without_webhook"]
FLOOR_NAMESPACE = NAMESPACES["constant_webhook"]
SYSTEMS = ("tmi", "hami", "floor", "none")


def arrivals(stream: str, seed: int) -> list[tuple[str, int, int]]:
    items = [(kind, gpus, gb) for kind, gpus, gb, count in STREAMS[stream] for _ in range(count)]
    random.Random(seed).shuffle(items)
    return items


def fleet() -> list[Any]:
    nodes = [
        h100(
            f"h100-{i:02d}",
            annotations={
                hami_peer.REGISTER: hami_peer.register_annotation(f"h100-{i:02d}", H100, 8)
            },
        )
        for i in range(H100_NODES)
    ]
    nodes += [
        l40s(
            f"l40s-{i:02d}",
            annotations={
                hami_peer.REGISTER: hami_peer.register_annotation(f"l40s-{i:02d}", L40S, 1)
            },
        )
        for i in range(L40S_NODES)
    ]
    return nodes


def envelope(owner: Owner) -> dict[str, Any]:
    """Whole H100-class GPUs (with p2p, for tensor-parallel Pods) and L40S accounted shares."""
    return with_profiles(
        owner,
        gpu_profile(
            "nvidia-whole",
            "whole-device",
            [gpu_binding(WHOLE, cc="8.0", memory="79Gi", features=["p2p"])],
        ),
        gpu_profile(
            "nvidia-vram-share",
            "accounted-share",
            [
                gpu_binding(
                    SHARE, allocator="vram-plugin", resource=VRAM, cc="8.9", cuda=12, memory="44Gi"
                )
            ],
        ),
    )


def tmi_pod(name: str, kind: str, gpus: int, gb: int) -> dict[str, Any]:
    if kind == "whole":
        resources = block("nvidia-whole")
        resources["accelerator"]["count"] = gpus
        document = request("vllm", inferenceResources=resources, config__tensor_parallel_size=gpus)
    else:
        document = request(inferenceResources=block("nvidia-vram-share", f"{gb}Gi"))
    return engine_pod(document, name=name, labels={ENGINE_LABEL: name})


def hami_pod(name: str, kind: str, gpus: int, gb: int) -> dict[str, Any]:
    if kind == "whole":
        return hami_peer.pod(name, gpus, None, "H100")
    return hami_peer.pod(name, 1, gb * 1024, "L40S")


def none_pod(name: str) -> dict[str, Any]:
    pod = hami_peer.pod(name, 1, None, "H100")
    pod["metadata"]["namespace"] = NONE_NAMESPACE
    return pod


def floor_pod(name: str) -> dict[str, Any]:
    pod = _engine(name)
    pod["metadata"]["namespace"] = FLOOR_NAMESPACE
    return pod


def create_stream(
    kube: Any, items: list[tuple[str, int, int]], prefix: str
) -> tuple[dict[str, list[float]], dict[str, list[str]]]:
    """Create the stream's Pods, one at a time, in each namespace in turn, the order rotating;
    return each one's create latencies and `tmi`'s and HAMi's Pod names. Beside `tmi` and
    HAMi: the constant-answer webhook (`bench/constant_webhook.py`, a Python aiohttp server
    returning `tmi`'s patch prepared once, behind the same kind of configuration; the floor
    of any webhook written as `tmi`'s is) and a namespace neither serves."""
    latency: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    names: dict[str, list[str]] = {"tmi": [], "hami": []}
    for index, (kind, gpus, gb) in enumerate(items):
        name = f"{prefix}-{kind}-{index:03d}"
        order = [
            ("tmi", tmi_pod(name, kind, gpus, gb)),
            ("hami", hami_pod(name, kind, gpus, gb)),
            ("floor", floor_pod(name)),
            ("none", none_pod(name)),
        ]
        shift = index % len(order)
        for system, body in order[shift:] + order[:shift]:
            start = time.perf_counter()
            stored = kube.create(body)
            latency[system].append(time.perf_counter() - start)
            if system in ("tmi", "floor") and not is_planned(stored):
                raise SystemExit(f"{system}'s Pod {name} was not planned")
            if system == "hami" and stored["spec"].get("schedulerName") != hami_peer.SCHEDULER_NAME:
                raise SystemExit(f"HAMi's webhook did not take Pod {name}")
            if system in names:
                names[system].append(name)
    return latency, names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hami-source", default=None, help="a HAMi checkout at the pinned commit")
    args = parser.parse_args()
    home = hami_peer.build(args.hami_source)
    owner = Owner()
    profile = owner.sign(envelope(owner), name=DEFAULT_CONFIGMAP_NAME)
    settings = WebhookSettings(
        owner_public_keys=(owner.public_key,),
        cluster_binding_id=CLUSTER,
        namespace=NAMESPACE,
        bundle_configmap=DEFAULT_CONFIGMAP_NAME,
        gpu_registry_credentials_secret="kamiwaza-pull",
        cpu_registry_credentials_secret="kamiwaza-pull",
        cert_reload_seconds=10.0,
    )
    load_before = os.getloadavg()[0]
    plane = ControlPlane.start(start_scheduler=False, apiserver_args=APISERVER_ARGS)
    hami = Hami(plane, home)
    standin = DevicePluginStandIn(plane)
    creates: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        stream: {"tmi": [], "hami": []} for stream in STREAMS
    }
    extender = None
    try:
        kube = plane.kube("admin")
        create_fake_nodes(kube, fleet())
        with deploy_webhook(plane, settings, profile) as hook:
            _grant_extender(plane)
            port = free_port()
            extender = _start_extender(plane, owner, port)
            plane.create_namespace(hami_peer.NAMESPACE)
            _namespaces(plane)
            constant = ConstantWebhook(plane, hook)
            constant.install()
            hami.start()
            standin.start()
            tmi_config = render_scheduler_config(extender_url=f"http://127.0.0.1:{port}")
            hami_config = hami.scheduler_config()
            for config in (tmi_config, hami_config):
                config["leaderElection"] = {"leaderElect": False}
                config["clientConnection"] = {"qps": 1000, "burst": 2000}
            configs = {
                "tmi": (tmi_config, NAMESPACE, extender.pid),
                "hami": (hami_config, hami_peer.NAMESPACE, hami.pid),
            }
            for repeat in range(args.repeats):
                for stream in STREAMS:
                    items = arrivals(stream, repeat)
                    latency, names = create_stream(kube, items, f"{stream[0]}{repeat}")
                    for system, values in latency.items():
                        creates[system] += values
                    order = ["tmi", "hami"] if repeat % 2 == 0 else ["hami", "tmi"]
                    for system in order:
                        config, namespace, pid = configs[system]
                        label = f"{system}-{stream}-{repeat}"
                        run = schedule_run(plane, config, label, namespace, names[system], pid)
                        run["packing"] = stranded(
                            kube, system, namespace, items, names[system], fleet()
                        )
                        runs[stream][system].append(run)
                        print(f"{label}: {json.dumps(run)[:300]}", file=sys.stderr)
                        # Before the other system runs: kube-scheduler counts every bound Pod's
                        # nvidia.com/gpu, HAMi's too, which its own configuration ignores.
                        clear(kube, [namespace])
                    clear(kube, [NONE_NAMESPACE, FLOOR_NAMESPACE])
            memory = {
                "tmi_webhook": memory_of(hook.process.pid if hook.process else 0),
                "tmi_extender": memory_of(extender.pid),
                "hami_scheduler": memory_of(hami.pid),
                "constant_webhook": memory_of(constant.process.pid),
            }
            constant.stop()
            webhook_reviews = hook.reviews()
    finally:
        standin.stop()
        hami.stop()
        if extender is not None and extender.poll() is None:
            extender.terminate()
        plane.stop()
    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "kubernetes": versions().kubernetes,
        "hami_commit": (home / "COMMIT").read_text().strip(),
        "load_average_1m_before": round(load_before, 2),
        "fleet": {"h100x8": H100_NODES, "l40s_48gb": L40S_NODES},
        "streams": {
            stream: [
                {"kind": kind, "gpus": gpus, "share_gb": gb, "count": count}
                for kind, gpus, gb, count in rows
            ]
            for stream, rows in STREAMS.items()
        },
        "repeats": args.repeats,
        "pod_create": {system: summary(values) for system, values in creates.items()},
        "tmi_webhook_reviews": webhook_reviews,
        "device_plugin_stand_in": {"locks_released": standin.released, "errors": standin.errors},
        "memory_mib": memory,
        "scheduling": {
            stream: {system: combine(values) for system, values in by_system.items()}
            for stream, by_system in runs.items()
        },
        "runs": runs,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: results[k] for k in ("pod_create", "memory_mib", "scheduling")}, indent=2))


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over repeats of each figure of a system's runs."""
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [run[key] for run in runs]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            out[key] = round(statistics.median(values), 3)
        elif all(isinstance(v, dict) for v in values):
            out[key] = combine(values)
    return out


if __name__ == "__main__":
    main()
