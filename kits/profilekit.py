"""Builders for signed profiles, requests and keys shared by every test tier.

Tests build their profiles from the same template the examples ship, with a fresh key, so a test
never depends on a committed private key and always signs with the real signing code.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from inference_policy.planning.catalog import EngineCatalog
from inference_policy.trust.signing import (
    DEFAULT_CONFIGMAP_NAME,
    TrustedKeys,
    VerifyPolicy,
    public_identity,
    sign_envelope,
)
from policy_io.catalog import packaged_catalog
from policy_io.offline import snapshot_of
from policy_io.snapshot import PolicySnapshot
from policy_io.state import PolicySettings

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
NOW_TEXT = "2026-11-29T12:00:00Z"
CLUSTER = "demo-cluster"
NAMESPACE = "kamiwaza"


def catalog_image(engine: str, vendor: str, arch: str, cuda: int | None = None) -> str:
    for row in packaged_catalog().rows():
        if row[:3] == (engine, vendor, arch) and (cuda is None or row[3] == str(cuda)):
            return row[4]
    raise LookupError(f"no catalog image {engine} {vendor} {arch} {cuda}")


class Owner:
    """An owner key with helpers to sign envelopes and describe the matching install settings."""

    def __init__(self, key: Ed25519PrivateKey | None = None) -> None:
        self.key = key or Ed25519PrivateKey.generate()
        identity = public_identity(self.key)
        self.key_id = identity["keyId"]
        self.public_key = identity["publicKey"]

    @property
    def raw_public(self) -> bytes:
        return base64.b64decode(self.public_key)

    def envelope(self, **overrides: Any) -> dict[str, Any]:
        text = (EXAMPLES / "profile-envelope.template.json").read_text()
        text = (
            text.replace("<KEY_ID>", self.key_id)
            .replace("<LLAMACPP_CPU_IMAGE>", catalog_image("llamacpp", "cpu", "amd64"))
            .replace("<LLAMACPP_CUDA_IMAGE>", catalog_image("llamacpp", "nvidia", "amd64", 13))
        )
        document: dict[str, Any] = json.loads(text)
        document.update(overrides)
        return document

    def sign(
        self, envelope: dict[str, Any] | None = None, name: str = DEFAULT_CONFIGMAP_NAME
    ) -> dict[str, Any]:
        return sign_envelope(envelope if envelope is not None else self.envelope(), self.key, name)

    def revision(self, version: int, name: str, uid: str) -> dict[str, Any]:
        """A signed profile ConfigMap of `version` named `name`, as read from the API (uid,
        resourceVersion 1)."""
        envelope = self.envelope()
        envelope["version"] = version
        configmap = self.sign(envelope, name=name)
        configmap["metadata"].update({"uid": uid, "resourceVersion": "1"})
        return configmap

    def policy(self, **overrides: Any) -> VerifyPolicy:
        values: dict[str, Any] = {
            "trusted": TrustedKeys.from_base64([self.public_key]),
            "cluster_binding_id": CLUSTER,
            "namespace": NAMESPACE,
            "minimum_version": 1,
            "configmap_name": DEFAULT_CONFIGMAP_NAME,
        }
        values.update(overrides)
        return VerifyPolicy(**values)

    def settings(self, **overrides: Any) -> PolicySettings:
        values: dict[str, Any] = {
            "enabled": True,
            "namespace": NAMESPACE,
            "owner_public_keys": (self.public_key,),
            "cluster_binding_id": CLUSTER,
        }
        values.update(overrides)
        return PolicySettings(**values)

    def state(
        self,
        envelope: dict[str, Any] | None = None,
        mutate: Callable[[dict[str, Any]], None] | None = None,
        *,
        catalog: EngineCatalog | None = None,
        **settings: Any,
    ) -> PolicySnapshot:
        """What a server with these settings plans with, having read the profile signed from
        `envelope` (changed by `mutate` after signing): the servers' own feed, fed the
        ConfigMap (`policy_io.offline`)."""
        configmap = self.sign(envelope)
        if mutate is not None:
            mutate(configmap)
        return snapshot_of(
            self.settings(**settings), NOW, profile=configmap, catalog=catalog or packaged_catalog()
        )


def request(engine: str = "llamacpp", **changes: Any) -> dict[str, Any]:
    """A deployment request (contract section 2) with nested overrides: model__layers=..."""
    document: dict[str, Any] = json.loads((EXAMPLES / "request-qwen7b-gguf.json").read_text())
    document["engine"] = engine
    if engine == "vllm":
        document["model"]["format"] = "safetensors"
        document["model"]["name"] = "Qwen/Qwen2.5-7B-Instruct"
        document["model"]["weightsBytes"] = 15_231_233_024
    if engine == "diffusion":
        document["model"] = {
            "name": "stabilityai/stable-diffusion-xl-base-1.0",
            "format": "diffusers",
            "weightsBytes": 6_938_040_682,
        }
        document["config"] = {}
    for key, value in changes.items():
        target = document
        parts = key.split("__")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        if value is _DELETE:
            target.pop(parts[-1], None)
        else:
            target[parts[-1]] = value
    return document


_DELETE = object()
DELETE: Any = _DELETE


def pinned_request(isolation: str = "whole-device", minimum: str = "8Gi") -> dict[str, Any]:
    """A request whose inferenceResources block pins its isolation (one device)."""
    return request(
        inferenceResources={
            "schemaVersion": 1,
            "accelerator": {
                "capability": "gpu",
                "count": 1,
                "memory": {"minimum": minimum},
                "isolation": isolation,
            },
            "runtime": {"selection": "automatic"},
        }
    )


def gpu_binding(
    binding_id: str,
    *,
    cc: str = "8.0",
    cuda: int | None = 13,
    arch: str = "amd64",
    vendor: str = "nvidia",
    memory: str = "79Gi",
    resource: str = "nvidia.com/gpu",
    features: list[str] | None = None,
    allocator: str = "extended-resource",
) -> dict[str, Any]:
    accelerator: dict[str, Any] = {
        "vendor": vendor,
        "features": features if features is not None else ["bf16"],
    }
    if vendor == "nvidia":
        accelerator["computeCapability"] = cc
    if cuda is not None:
        accelerator["cudaDriverMajor"] = cuda
    image = catalog_image("llamacpp", "nvidia", "amd64", 13)
    return {
        "id": binding_id,
        "allocator": allocator,
        "architecture": arch,
        "accelerator": accelerator,
        "capacity": {
            "kind": "accounted" if allocator == "vram-plugin" else "scheduler",
            "usableMemory": memory,
        },
        "resource": {"name": resource, "quantity": 1},
        "runtime": {
            "kind": "rocm" if vendor == "amd" else "cuda",
            "variantId": f"llamacpp-{vendor}-{arch}",
            "image": image,
        },
        "runtimeClassName": "nvidia",
        "nodeSelector": {"kubernetes.io/arch": arch},
    }


def gpu_profile(
    name: str, guarantee: str, bindings: list[dict[str, Any]], variants: list[str] | None = None
) -> dict[str, Any]:
    archs = sorted({b["architecture"] for b in bindings})
    vendors = sorted({b["accelerator"]["vendor"] for b in bindings})
    default = [
        f"{engine}-{vendor}-{arch}"
        for engine in ("llamacpp", "vllm", "diffusion")
        for vendor in vendors
        for arch in archs
    ]
    return {
        "name": name,
        "capability": "gpu",
        "guarantees": [guarantee],
        "compatibleVariantIds": variants if variants is not None else default,
        "bindings": bindings,
    }


def with_profiles(owner: Owner, *profiles: dict[str, Any], keep_cpu: bool = True) -> dict[str, Any]:
    envelope = owner.envelope()
    base = [p for p in envelope["profiles"] if p["capability"] == "cpu"] if keep_cpu else []
    envelope["profiles"] = base + list(profiles)
    return envelope


def clone(document: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(document)


def dra_binding(
    binding_id: str,
    *,
    device_type: str = "gpu",
    product: str = "NVIDIA H100 80GB HBM3",
    gpu_architecture: str = "Hopper",
    device_memory: str = "80Gi",
    usable: str = "79Gi",
    cc: str = "9.0",
    cuda: int | None = 13,
    driver: str = "580.65.6",
    mig_profile: str | None = None,
    uuids: list[str] | None = None,
    features: list[str] | None = None,
) -> dict[str, Any]:
    """A `dra` binding for NVIDIA's DRA driver, its device facts as the driver publishes them."""
    binding = gpu_binding(binding_id, cc=cc, cuda=cuda, memory=usable, features=features)
    del binding["resource"]
    binding["allocator"] = "dra"
    device: dict[str, Any] = {
        "driver": "gpu.nvidia.com",
        "type": device_type,
        "productName": product,
        "architecture": gpu_architecture,
        "driverVersion": driver,
        "memory": device_memory,
    }
    if mig_profile is not None:
        device["migProfile"] = mig_profile
    if uuids is not None:
        device["uuids"] = uuids
    binding["device"] = device
    return binding
