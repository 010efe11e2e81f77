"""A profile draft from what `tmi detect --host` measured on each GPU node (or what GPU Feature
Discovery labels on its Node), by the seed's rules.

Writing a profile by hand is arithmetic an owner gets wrong: which facts a binding may attest
when its nodes differ, and how much memory a deployment may plan on. The seed's rules, applied
here once:

* one whole-device binding per GPU model and architecture; a binding covers every node of its
  architecture that advertises its resource, so it attests what holds on all of them: the
  lowest compute capability and CUDA driver major, the features every node has, the least
  memory;
* `usableMemory` for a whole device on a discrete card is the card's memory less what the
  driver reserves, in whole Gi rounded down (`understating it is the safe direction`): 139Gi
  on an H200 (143771 MiB, 616 reserved), 79Gi on an 80 GB card;
* a CPU binding per architecture seen, and each GPU profile's compatibleVariantIds the engines
  the catalog ships for that architecture; the runtime image the llama.cpp image the catalog
  selects for the binding's facts (`EngineCatalog.select_gpu_image`, the planner's rule).

MIG and VRAM-share bindings depend on how the owner cuts the cards, which detection cannot see,
so the draft leaves them to the owner and says so. What the draft cannot know (the window, the
version, the evidence label) it fills with values to review, and the notes name the nodes and
models it drew on. Pure: documents in, a draft and notes out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from inference_policy.allocation.gfd import (
    GFD_CC_MAJOR,
    GFD_CC_MINOR,
    GFD_CUDA_MAJOR,
    GFD_CUDA_MAJOR_OLD,
    GFD_MEMORY,
    GFD_PRODUCT,
    int_label,
)
from inference_policy.base.pod_view import ObjectView, mapping_at
from inference_policy.planning.catalog import EngineCatalog
from inference_policy.tools.detection import BF16_MIN_CC, FP8_MIN_CC
from inference_policy.trust.profile import format_timestamp

_SLUG = re.compile(r"[^a-z0-9]+")


class DraftError(ValueError):
    """An observation the draft cannot use; the message names it."""


@dataclass(frozen=True, slots=True)
class Observed:
    """One node as `tmi detect --host` saw it."""

    node: str
    architecture: str
    compute_capability: str
    cuda_driver_major: int
    features: tuple[str, ...]
    gpus: tuple[Mapping[str, Any], ...]


def observed(document: Mapping[str, Any], where: str) -> Observed:
    """A `tmi detect --host` output, checked for what the draft reads."""
    try:
        accelerator = document["accelerator"]
        host = document["host"]
        return Observed(
            node=str(host["node"]),
            architecture=str(host["architecture"]),
            compute_capability=str(accelerator["computeCapability"]),
            cuda_driver_major=int(accelerator["cudaDriverMajor"]),
            features=tuple(accelerator["features"]),
            gpus=tuple(host["gpus"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DraftError(
            f"{where} is not `tmi detect --host` output (missing or malformed {exc})"
        ) from None


# What the driver holds back of a card when nothing measured it (GPU Feature Discovery's
# labels give the total only): a GiB, in the safe direction (616 MiB on the recorded H200).
ASSUMED_RESERVE_MIB = 1024


def usable_memory_gi(total_mib: int, reserved_mib: int | None) -> int:
    """The seed's rule for a whole device on a discrete card, in whole Gi rounded down."""
    reserve = ASSUMED_RESERVE_MIB if reserved_mib is None else reserved_mib
    return (total_mib - reserve) // 1024


def observed_node(node: Mapping[str, Any]) -> Observed | None:
    """A Node as GPU Feature Discovery labels it (None: no whole GPU to draft from): model,
    count and memory from its labels, compute capability and CUDA major, the features the
    compute capability implies and `mig` where MIG is possible. Peer paths are not labelled,
    so no p2p or nvlink is drafted; the reserve is not labelled, so ASSUMED_RESERVE_MIB is."""
    view = ObjectView(node)
    labels = view.labels
    allocatable = mapping_at(view.status, "allocatable")
    product = labels.get(GFD_PRODUCT)
    memory = int_label(labels, GFD_MEMORY)
    major, minor = int_label(labels, GFD_CC_MAJOR), int_label(labels, GFD_CC_MINOR)
    cuda = int_label(labels, GFD_CUDA_MAJOR) or int_label(labels, GFD_CUDA_MAJOR_OLD)
    whole = str(allocatable.get("nvidia.com/gpu", "0"))
    if not product or memory is None or major is None or cuda is None or not whole.isdigit():
        return None
    count = int(whole)
    if count == 0:
        return None
    cc = (major, minor or 0)
    features = [f for f, floor in (("bf16", BF16_MIN_CC), ("fp8", FP8_MIN_CC)) if cc >= floor]
    if labels.get("nvidia.com/mig.capable") == "true":
        features.append("mig")
    gpu = {
        "model": product.replace("-", " "),
        "memoryTotalMiB": memory,
        "memoryReservedMiB": None,
        "migMode": None,
    }
    return Observed(
        node=str(view.name),
        architecture=str(labels.get("kubernetes.io/arch", "amd64")),
        compute_capability=f"{cc[0]}.{cc[1]}",
        cuda_driver_major=cuda,
        features=tuple(features),
        gpus=tuple({**gpu, "index": i} for i in range(count)),
    )


def _cc_key(cc: str) -> tuple[int, int]:
    major, _, minor = cc.partition(".")
    return int(major), int(minor or 0)


def _slug(text: str) -> str:
    return _SLUG.sub("-", text.lower()).strip("-")


def _gpu_image(catalog: EngineCatalog, arch: str, cc: str, cuda: int) -> str | None:
    """The llama.cpp image the catalog selects for these facts (its own rule: the newest the
    card and the driver both run), the binding's runtime image."""
    engine = catalog.qualified("llamacpp")
    if engine is None:
        return None
    image = catalog.select_gpu_image(engine, "nvidia", arch, _cc_key(cc), cuda).image
    return image.pinned if image is not None else None


def _cpu_image(catalog: EngineCatalog, arch: str) -> str | None:
    engine = catalog.qualified("llamacpp")
    image = catalog.cpu_image(engine, arch) if engine is not None else None
    return image.pinned if image is not None else None


def _variants(catalog: EngineCatalog, arch: str) -> list[str]:
    engines = sorted({r[0] for r in catalog.rows() if r[1] == "nvidia" and r[2] == arch})
    return [f"{engine}-nvidia-{arch}" for engine in engines]


def _assumed(members: Sequence[tuple[Observed, Mapping[str, Any]]]) -> bool:
    return any(g.get("memoryReservedMiB") is None for _, g in members)


def draft_envelope(
    nodes: Iterable[Observed],
    catalog: EngineCatalog,
    *,
    key_id: str,
    cluster_binding_id: str,
    namespace: str,
    now: datetime,
    days: int = 90,
) -> tuple[dict[str, Any], list[str]]:
    """The envelope the seed's rules give for these nodes, and the notes on what it drew on and
    what it left to the owner."""
    seen = list(nodes)
    if not seen:
        raise DraftError("no node was observed; give one `tmi detect --host` output per node")
    notes: list[str] = []
    groups: dict[tuple[str, str], list[tuple[Observed, Mapping[str, Any]]]] = {}
    for node in seen:
        for gpu in node.gpus:
            if gpu.get("migMode") == "Enabled":
                notes.append(
                    f"{node.node} GPU {gpu.get('index')} ({gpu.get('model')}) is in MIG mode: "
                    "write its MIG binding by hand (slice memory less CUDA context headroom)"
                )
                continue
            groups.setdefault((node.architecture, str(gpu["model"])), []).append((node, gpu))
    profiles: list[dict[str, Any]] = []
    for arch in sorted({n.architecture for n in seen}):
        image = _cpu_image(catalog, arch)
        if image is None:
            notes.append(f"the catalog has no CPU image for {arch}: no CPU binding drafted")
            continue
        profiles.append(
            {
                "name": f"cpu-{arch}",
                "capability": "cpu",
                "guarantees": [],
                "compatibleVariantIds": ["cpu-default"],
                "bindings": [
                    {
                        "id": f"cpu-{arch}",
                        "allocator": "cpu",
                        "architecture": arch,
                        "runtime": {"kind": "cpu", "variantId": "cpu-default", "image": image},
                        "capacity": {"kind": "scheduler"},
                        "nodeSelector": {"kubernetes.io/arch": arch},
                    }
                ],
            }
        )
    bindings_by_arch: dict[str, list[dict[str, Any]]] = {}
    for (arch, model), members in sorted(groups.items()):
        hosts = sorted({n.node for n, _ in members})
        cc = min((n.compute_capability for n, _ in members), key=_cc_key)
        cuda = min(n.cuda_driver_major for n, _ in members)
        features = sorted(set.intersection(*(set(n.features) for n, _ in members)))
        usable = min(
            usable_memory_gi(int(g["memoryTotalMiB"]), g.get("memoryReservedMiB"))
            for _, g in members
        )
        image = _gpu_image(catalog, arch, cc, cuda)
        if image is None:
            notes.append(f"the catalog has no CUDA {cuda} image for {arch}: {model} left out")
            continue
        binding_id = f"{_slug(model)}-{arch}"
        bindings_by_arch.setdefault(arch, []).append(
            {
                "id": binding_id,
                "allocator": "extended-resource",
                "architecture": arch,
                "accelerator": {
                    "vendor": "nvidia",
                    "computeCapability": cc,
                    "cudaDriverMajor": cuda,
                    "features": features,
                },
                "capacity": {"kind": "scheduler", "usableMemory": f"{usable}Gi"},
                "resource": {"name": "nvidia.com/gpu", "quantity": 1},
                "runtime": {
                    "kind": "cuda",
                    "variantId": f"llamacpp-nvidia-{arch}",
                    "image": image,
                },
                "runtimeClassName": "nvidia",
                "nodeSelector": {"kubernetes.io/arch": arch},
            }
        )
        notes.append(
            f"binding {binding_id}: {len(members)} {model} GPU(s) on {', '.join(hosts)}; "
            f"usableMemory {usable}Gi (the least memory less the driver's reserve, whole Gi"
            f"{'; the reserve assumed, as labels do not give it' if _assumed(members) else ''}); "
            f"attests compute capability {cc}, CUDA {cuda}, features {features or 'none'} "
            "(what every node has)"
        )
    for arch, bindings in sorted(bindings_by_arch.items()):
        profiles.append(
            {
                "name": f"nvidia-whole-{arch}",
                "capability": "gpu",
                "guarantees": ["whole-device"],
                "compatibleVariantIds": _variants(catalog, arch),
                "bindings": bindings,
            }
        )
    if not bindings_by_arch:
        notes.append("no whole GPU was observed: the draft has no GPU profile")
    notes.append(
        "review before signing: version, the window (issuedAt now, expiresAt in "
        f"{days} days), evidenceId; MIG and VRAM-share bindings are the owner's to add"
    )
    envelope = {
        "schemaVersion": 1,
        "clusterBindingId": cluster_binding_id,
        "namespace": namespace,
        "version": 1,
        "keyId": key_id,
        "issuedAt": format_timestamp(now),
        "expiresAt": format_timestamp(now + timedelta(days=days)),
        "evidenceId": f"tmi-draft-{now.strftime('%Y-%m-%d')}",
        "profiles": profiles,
    }
    return envelope, notes


__all__ = [
    "ASSUMED_RESERVE_MIB",
    "DraftError",
    "Observed",
    "draft_envelope",
    "observed",
    "observed_node",
    "usable_memory_gi",
]
