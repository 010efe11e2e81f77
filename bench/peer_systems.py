"""The systems `bench_peer.py` compares, each as it is installed: what its Pods look like, which
kube-scheduler configuration places them, who in its path talks to the API server, and which
processes are its own.

* `tmi`: its webhook plans the Pod; a kube-scheduler with the configuration its chart renders
  (`tmi render-scheduler-config`: the extender over HTTPS with the CA, the chart's `--v=2`,
  kube-scheduler's default client limits) calls its extender and binds.
* `hami-installed`, `hami-tuned`, `hami-spread`: HAMi's webhook and extender (one process, as
  `hami_peer.CONFIGS` runs it), the kube-scheduler its chart configures (`-v=4`), its device
  plugin's calls (`hami_standin.py`).
* `constant`: the floor of a webhook and an extender written as `tmi`'s are: the constant
  webhook returning `tmi`'s own prepared answer (its scheduler name changed, so its Pods wait
  in a queue of their own) and the constant extender, over HTTPS, behind `tmi`'s scheduler
  configuration.
* `none`: no webhook and a stock kube-scheduler without an extender, the Pods asking for the
  node resources directly.

Every kube-scheduler authenticates as a user of its own (in system:masters, as the chart's
bindings let it do what it does), so `peer_audit.py` can count each path's requests.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import hami_peer
import hami_standin
from constant_pair import CONSTANT_NAMESPACE, NONE_NAMESPACE, engine, in_namespace

from inference_policy.base.wire import ENGINE_LABEL
from inference_policy.placing.schedconfig import DEFAULT_SCHEDULER_NAME, render_scheduler_config
from kits.extenderkit import SHARE, VRAM, WHOLE, block
from kits.profilekit import NAMESPACE, Owner, gpu_binding, gpu_profile, request, with_profiles
from kits.webhookkit import engine_pod
from localcluster import ControlPlane
from localcluster.servers.webhook import is_planned

# (kind, GPUs, share GB) of one engine Pod.
Item = tuple[str, int, int]
CONSTANT_SCHEDULER = "bench-constant-scheduler"
TMI_EXTENDER_USER = "tmi-extender"
SHARE_RESOURCE = "kamiwaza.ai/vram-gb-gpu-0"
# The chart's kube-scheduler verbosity (charts/tmi owner.scheduler: `--v=2`).
TMI_SCHEDULER_VERBOSITY = 2


@dataclass
class System:
    """One system as the benchmark runs it."""

    name: str
    namespace: str
    config: dict[str, Any]
    verbosity: int
    # Its own servers' processes by role (the kube-scheduler's is added while it runs).
    pids: dict[str, int]
    build: Callable[[str, Item], dict[str, Any]]
    admitted: Callable[[Mapping[str, Any]], bool]
    users: set[str] = field(default_factory=set)

    @property
    def scheduler_identity(self) -> str:
        return f"sched-{self.name}"

    @property
    def scheduler_user(self) -> str:
        return scheduler_user(self.name)

    @property
    def scheduler_name(self) -> str:
        return str(self.config["profiles"][0]["schedulerName"])


def scheduler_user(system: str) -> str:
    return f"bench:kube-scheduler:{system}"


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


def tmi_pod(name: str, item: Item) -> dict[str, Any]:
    kind, gpus, gb = item
    if kind == "whole":
        resources = block("nvidia-whole")
        resources["accelerator"]["count"] = gpus
        document = request("vllm", inferenceResources=resources, config__tensor_parallel_size=gpus)
    else:
        document = request(inferenceResources=block("nvidia-vram-share", f"{gb}Gi"))
    return engine_pod(document, name=name, labels={ENGINE_LABEL: name})


def hami_pod(config: hami_peer.Config) -> Callable[[str, Item], dict[str, Any]]:
    def build(name: str, item: Item) -> dict[str, Any]:
        kind, gpus, gb = item
        if kind == "whole":
            return hami_peer.pod(name, gpus, None, "H100", config.namespace)
        return hami_peer.pod(name, 1, gb * 1024, "L40S", config.namespace)

    return build


def constant_pod(name: str, _: Item) -> dict[str, Any]:
    return in_namespace(engine(name), CONSTANT_NAMESPACE)


def none_pod(name: str, item: Item) -> dict[str, Any]:
    kind, gpus, gb = item
    requests = {hami_peer.GPU: str(gpus)} if kind == "whole" else {SHARE_RESOURCE: str(gb)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NONE_NAMESPACE},
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "image": "registry.invalid/engine:1",
                    "resources": {"requests": requests, "limits": requests},
                }
            ]
        },
    }


def _scheduler_named(name: str) -> Callable[[Mapping[str, Any]], bool]:
    def admitted(stored: Mapping[str, Any]) -> bool:
        return bool(stored.get("spec", {}).get("schedulerName") == name)

    return admitted


def _planned_for(name: str) -> Callable[[Mapping[str, Any]], bool]:
    def admitted(stored: Mapping[str, Any]) -> bool:
        return is_planned(stored) and stored.get("spec", {}).get("schedulerName") == name

    return admitted


def tmi_config(
    url: str, ca_pem: bytes, scheduler_name: str = DEFAULT_SCHEDULER_NAME
) -> dict[str, Any]:
    """The configuration `tmi`'s chart renders, calling the extender at `url` over HTTPS."""
    config = render_scheduler_config(extender_url=url, ca_pem=ca_pem, scheduler_name=scheduler_name)
    config["leaderElection"] = {"leaderElect": False}
    return config


def build_systems(
    plane: ControlPlane,
    *,
    tmi_url: str,
    tmi_pids: dict[str, int],
    webhook_user: str,
    constant_url: str,
    constant_pids: dict[str, int],
    hamis: Mapping[str, hami_peer.Hami],
) -> dict[str, System]:
    """Every system, by name, in the order they are reported."""
    ca_pem = base64.b64decode(plane.ca_bundle)
    tmi = tmi_config(tmi_url, ca_pem)
    out = {
        "tmi": System(
            "tmi",
            NAMESPACE,
            tmi,
            TMI_SCHEDULER_VERBOSITY,
            dict(tmi_pids),
            tmi_pod,
            _planned_for(str(tmi["profiles"][0]["schedulerName"])),
            {webhook_user, TMI_EXTENDER_USER},
        )
    }
    for hami in hamis.values():
        config = hami.config
        out[config.system] = System(
            config.system,
            config.namespace,
            hami.scheduler_config(),
            hami_peer.CHART_SCHEDULER_VERBOSITY,
            {"hami": hami.pid},
            hami_pod(config),
            _scheduler_named(config.scheduler_name),
            {hami.user, hami_standin.USER},
        )
    out["constant"] = System(
        "constant",
        CONSTANT_NAMESPACE,
        tmi_config(constant_url, ca_pem, CONSTANT_SCHEDULER),
        TMI_SCHEDULER_VERBOSITY,
        dict(constant_pids),
        constant_pod,
        _planned_for(CONSTANT_SCHEDULER),
    )
    out["none"] = System(
        "none",
        NONE_NAMESPACE,
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": "default-scheduler"}],
        },
        TMI_SCHEDULER_VERBOSITY,
        {},
        none_pod,
        _scheduler_named("default-scheduler"),
    )
    for system in out.values():
        plane.add_identity(system.scheduler_identity, system.scheduler_user, ("system:masters",))
        system.users.add(system.scheduler_user)
    return out


SYSTEMS = ("tmi", *(config.system for config in hami_peer.CONFIGS), "constant", "none")


def audited_users() -> set[str]:
    """Every user whose requests the audit policy records, known before the API server starts:
    each system's kube-scheduler, the HAMi processes, the stand-in and `tmi`'s extender
    (`tmi`'s webhook is a ServiceAccount, which the policy records by its group)."""
    users = {scheduler_user(name) for name in SYSTEMS}
    users |= {hami_peer.user_of(config) for config in hami_peer.CONFIGS}
    return users | {hami_standin.USER, TMI_EXTENDER_USER}


__all__ = [
    "CONSTANT_SCHEDULER",
    "NONE_NAMESPACE",
    "SHARE_RESOURCE",
    "SYSTEMS",
    "Item",
    "System",
    "audited_users",
    "build_systems",
    "envelope",
]
