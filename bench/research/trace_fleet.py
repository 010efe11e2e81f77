"""Research, not a product benchmark (see bench/research/README.md).

The Alibaba GPU trace's fleet and deployments as this project's allocation classes, and the
extender's view of each deployment.

Both placement benchmarks (`bench_placement.py`, arrivals only; `bench_churn.py`, with
departures) replay the same nodes and tasks, mapped the same way onto whole GPUs, MIG slices and
accounted VRAM shares (`bench_placement.py`'s docstring says how), and judge every deployment
through the extender's own `Demand`, built by the real plan parser.
"""

from __future__ import annotations

import csv
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference_policy.placing.placement import Demand, demand_for
from inference_policy.planning.plan import parse_plan
from inference_policy.trust.profile import ExtendedResourceBinding, VramPluginBinding
from kits.profilekit import gpu_binding
from localcluster.nodes.kwok import FakeNode

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "data"
SHARE_CARD_GIB = 48
REPLAYS = 2
MIG_SHAPES = (("1g.10gb", 9), ("2g.20gb", 19), ("3g.40gb", 38))
MIG_LAYOUT = {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}  # per A100 80GB GPU
VRAM = "kamiwaza.ai/vram-gb-gpu-0"
WHOLE_MODELS = {"G2", "V100M32", "V100M16"}
MIG_MODELS = {"G3"}
SHARE_MODELS = {"T4", "P100", "A10"}


# -- fleet and deployments ------------------------------------------------------------------------


@dataclass
class Item:
    index: int
    name: str
    cls: str
    resource: str
    qty: int


@dataclass
class Fleet:
    specs: list[FakeNode] = field(default_factory=list)
    classes: dict[str, list[str]] = field(default_factory=dict)


def build_fleet(limit: int | None = None) -> Fleet:
    fleet = Fleet()
    with (DATA / "openb_node_list_gpu_node.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    for row in rows[:limit]:
        name, gpus, model = row["sn"], int(row["gpu"]), row["model"]
        if model in WHOLE_MODELS:
            fleet.specs.append(FakeNode(name, gpus=gpus))
            fleet.classes.setdefault("whole", []).append(name)
        elif model in MIG_MODELS:
            mig = {shape: count * gpus for shape, count in MIG_LAYOUT.items()}
            fleet.specs.append(
                FakeNode(
                    name,
                    gpu_product="NVIDIA-A100-SXM4-80GB",
                    compute_capability="8.0",
                    gpus=gpus,
                    mig=mig,
                    whole_gpus=0,
                )
            )
            fleet.classes.setdefault("mig", []).append(name)
        elif model in SHARE_MODELS:
            for gpu in range(gpus):
                bucket = f"{name}-gpu{gpu}"
                fleet.specs.append(share_bucket(bucket))
                fleet.classes.setdefault("vram", []).append(bucket)
    return fleet


def share_bucket(name: str) -> FakeNode:
    """One L40S modelled as a node of its own, its memory one accounted VRAM bucket."""
    return FakeNode(
        name,
        gpu_product="NVIDIA-L40S",
        compute_capability="8.9",
        cuda_driver_major=12,
        vram_gb=SHARE_CARD_GIB,
        vram_budget=True,
    )


def asks_mig(name: str) -> bool:
    """Whether a shared task asks for a MIG slice (half of them, by a hash of the name) rather
    than an accounted VRAM share."""
    return hashlib.sha256(name.encode()).digest()[0] % 2 == 0


def build_items(replays: int = REPLAYS) -> list[Item]:
    with (DATA / "openb_pod_list_default.gpu.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    rows.sort(key=lambda r: (int(r["creation_time"]), r["name"]))
    items: list[Item] = []
    for replay in range(replays):
        for row in rows:
            name = f"{row['name']}-r{replay}"
            count, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if milli >= 1000:
                items.append(Item(len(items), name, "whole", "nvidia.com/gpu", count))
                continue
            need = math.ceil(milli * SHARE_CARD_GIB / 1000)
            shape = next((s for s, usable in MIG_SHAPES if usable >= need), None)
            if asks_mig(row["name"]) and shape is not None:
                items.append(Item(len(items), name, "mig", f"nvidia.com/mig-{shape}", 1))
            else:
                items.append(Item(len(items), name, "vram", VRAM, need))
    return items


# -- the extender's view of a deployment ----------------------------------------------------------


def _binding(resource: str) -> Any:
    if resource == VRAM:
        return VramPluginBinding.model_validate(
            gpu_binding(
                "share", allocator="vram-plugin", resource=VRAM, cc="8.9", cuda=12, memory="44Gi"
            )
        )
    memory = {"nvidia.com/gpu": "79Gi"}.get(resource)
    if memory is None:
        shape = resource.removeprefix("nvidia.com/mig-")
        memory = f"{dict(MIG_SHAPES)[shape]}Gi"
    return ExtendedResourceBinding.model_validate(
        gpu_binding(resource.replace("/", "-").replace(".", "-"), resource=resource, memory=memory)
    )


def gpu_plan(binding: Any, quantity: int) -> dict[str, Any]:
    """A plan as the planner writes one for `quantity` units of the binding's resource."""
    name = binding.resource.name
    return {
        "status": 200,
        "path": "gpu",
        "derived": True,
        "profile": "bench",
        "bindingId": binding.id,
        "engine": "llamacpp",
        "variantId": "llamacpp-nvidia-amd64",
        "image": "registry.invalid/llamacpp@sha256:" + "1" * 64,
        "runtimeClassName": "nvidia",
        "nodeSelector": {"kubernetes.io/arch": "amd64"},
        "resources": {"requests": {name: str(quantity)}, "limits": {name: str(quantity)}},
        "deviceCount": quantity if name == "nvidia.com/gpu" else 1,
        "engineArgs": {},
        "inferenceResources": {
            "schemaVersion": 1,
            "accelerator": {"capability": "gpu", "count": 1, "memory": {"minimum": "1Gi"}},
            "runtime": {"selection": "automatic"},
        },
        "bundle": {"version": 1, "sha256": "0" * 64},
    }


class Demands:
    """One `Demand` per (resource, quantity), built through the real plan parser."""

    def __init__(self) -> None:
        self.bindings: dict[str, Any] = {}
        self.cache: dict[tuple[str, int], Demand] = {}

    def get(self, item: Item) -> Demand:
        key = (item.resource, item.qty)
        demand = self.cache.get(key)
        if demand is None:
            binding = self.bindings.get(item.resource) or _binding(item.resource)
            self.bindings[item.resource] = binding
            demand = demand_for(parse_plan(gpu_plan(binding, item.qty)), binding, None, "bench")
            self.cache[key] = demand
        return demand


__all__ = [
    "DATA",
    "MIG_LAYOUT",
    "MIG_SHAPES",
    "REPLAYS",
    "ROOT",
    "SHARE_CARD_GIB",
    "VRAM",
    "Demands",
    "Fleet",
    "Item",
    "asks_mig",
    "build_fleet",
    "build_items",
    "gpu_plan",
    "share_bucket",
]
