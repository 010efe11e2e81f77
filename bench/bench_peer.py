"""`tmi` beside HAMi (v2.10) on one local control plane: the same fleet, the same engine Pods,
every system measured in one run, interleaved, each as it is installed.

A cluster owner choosing a GPU admission and scheduling layer compares `tmi` with HAMi, the
webhook and scheduler extender they would pick instead. `peer_systems.py` says how each system
runs: `tmi` as its chart runs it (its webhook, its extender over HTTPS, a stock kube-scheduler
with the configuration its chart renders), HAMi three ways (`hami_peer.CONFIGS`: as its chart
installs it, with its client limits raised, and raised with the `spread` node policy; its
scheduler built from its source, its chart's scheduler and webhook configuration and verbosity,
its device plugin's part played by `hami_standin.py`, which releases each node lock after a
stated delay and whose API calls count as HAMi's), and two floors: a constant webhook and
extender behind `tmi`'s configuration, and no webhook or extender at all.

The fleet (KWOK nodes, `peer_phases.py`) carries every system's facts on the same nodes: GPU
Feature Discovery's labels and the device plugins' resources that `tmi`'s signed bindings are
checked against, and the device registration HAMi's device plugin writes. H100 nodes (8 GPUs)
serve whole GPUs, L40S nodes (one 48 GB card, an accounted VRAM bucket for `tmi`) serve shares.
The Pods are one seeded mix: whole-GPU Pods of 1, 2 and 4 GPUs and shares of 8, 16 and 24 GB,
each system's in its own terms and its own namespace. Three measurements, in this order:

1. Each extender's filter round trip, called directly with the same node names and an
   equivalent Pod (`peer_filter.py`).
2. A burst: the mix created one Pod at a time, rotating between the systems' namespaces (the
   Pod-create latency through each webhook), the floors' Pods deleted at once, then each
   scheduling system's kube-scheduler started over its own waiting Pods in turn, the order
   rotating between repeats (`peer_measure.py`): throughput, the scheduler's account of its
   attempts, CPU and API requests per Pod. A burst is a Deployment scaled up at once.
3. Steady arrival (`peer_arrival.py`, `peer_phases.py`): every system's kube-scheduler running,
   engine Pods created at 2, 5, 10 and 20 a second in one system's namespace at a time: per
   Pod, create to bound (webhook, scheduling and bind together), p50 and p99, with the API
   requests per Pod and the machine's load average. `tmi`, the constant pair and no extender
   take turns in slices of a few Pods (ABC CBA ...), so a neighbour's load on the shared
   machine falls on the three alike; each HAMi configuration runs one window a rate (its queue
   builds across the window); the blocks' order alternates between rates.

Each system's Pods are deleted before the next run (kube-scheduler counts the `nvidia.com/gpu`
of every bound Pod, HAMi's too, which HAMi's own configuration tells its scheduler to ignore),
and any HAMi node lock left behind is removed. Resident memory is read at the end, per process
and per install. Results are rewritten to `bench/results/peer.json` after every run, so a run
stopped halfway keeps what it measured.

Needs the control-plane binaries (`make controlplane`) and Go (HAMi is built on first use:
`tools/hami/build.sh [SOURCE_DIR]`, $HAMI_SRC for a local checkout). Run:
`.venv/bin/python bench/bench_peer.py` (about nine minutes on 2 cores), `--tiny` for a check of
the machinery in about three, `--full` for the longer run (100 Pods a rate, the 123-Pod burst
and a stream with more than the fleet holds, three repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.append(str(ROOT))  # the checkout, for a script run by path

import hami_peer  # noqa: E402
from constant_pair import ConstantWebhook, create_namespaces  # noqa: E402
from hami_peer import Hami  # noqa: E402
from hami_standin import DevicePluginStandIn  # noqa: E402
from peer_audit import AuditTail, policy_args  # noqa: E402
from peer_filter import filter_round_trips  # noqa: E402
from peer_measure import memory_of  # noqa: E402
from peer_phases import H100_NODES, L40S_NODES, Race, fleet, run_burst, run_steady  # noqa: E402
from peer_report import Record  # noqa: E402
from peer_systems import (  # noqa: E402
    CONSTANT_SCHEDULER,
    System,
    audited_users,
    build_systems,
    envelope,
)
from scheduling_run import (  # noqa: E402
    APISERVER_ARGS,
    grant_extender,
    start_constant_extender,
    start_extender,
)

from inference_policy.trust.signing import DEFAULT_CONFIGMAP_NAME  # noqa: E402
from kits.profilekit import CLUSTER, NAMESPACE, Owner  # noqa: E402
from localcluster import ControlPlane, create_fake_nodes, versions  # noqa: E402
from localcluster.plane.process import free_port  # noqa: E402
from localcluster.servers.webhook import WebhookSettings, deploy_webhook  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "peer.json"
# What each mode runs: Pods a rate, the rates, burst Pods, a burst run's limit, how long a
# window waits for its last Pods, filter calls a system and kind, burst repeats, streams, and
# the slices the systems that bind in milliseconds take turns in at each rate.
MODES: dict[str, dict[str, Any]] = {
    "tiny": {
        "pods_per_rate": 6,
        "rates": (5.0, 20.0),
        "burst_pods": 10,
        "burst_timeout_s": 30.0,
        "drain_s": 10.0,
        "filter_calls": 5,
        "repeats": 1,
        "streams": ("fits",),
        "slices": 2,
    },
    "default": {
        "pods_per_rate": 24,
        "rates": (2.0, 5.0, 10.0, 20.0),
        "burst_pods": 40,
        "burst_timeout_s": 30.0,
        "drain_s": 15.0,
        "filter_calls": 20,
        "repeats": 1,
        "streams": ("fits",),
        "slices": 4,
    },
    "full": {
        "pods_per_rate": 100,
        "rates": (2.0, 5.0, 10.0, 20.0),
        "burst_pods": 0,
        "burst_timeout_s": 300.0,
        "drain_s": 60.0,
        "filter_calls": 100,
        "repeats": 3,
        "streams": ("fits", "overfull"),
        "slices": 10,
    },
}


def memory(
    plane: ControlPlane, systems: dict[str, System], hook_pid: int, extra: dict[str, int]
) -> dict[str, Any]:
    """Each process's resident memory, and each install's: its servers, and with the
    kube-scheduler beside them."""
    pids = plane.pids()
    per_process = {"tmi-webhook": memory_of(hook_pid)}
    per_process.update({name: memory_of(pid) for name, pid in extra.items()})
    installs: dict[str, Any] = {}
    for system in systems.values():
        servers = {role: memory_of(pid)["rss"] for role, pid in system.pids.items()}
        scheduler_pid = pids.get(f"scheduler-steady-{system.name}")
        scheduler = memory_of(scheduler_pid)["rss"] if scheduler_pid else 0.0
        per_process[f"{system.name} kube-scheduler"] = {"rss": scheduler}
        installs[system.name] = {
            "servers": servers,
            "servers_rss": round(sum(servers.values()), 1),
            "with_kube_scheduler_rss": round(sum(servers.values()) + scheduler, 1),
        }
    return {"per_process": per_process, "per_install": installs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--tiny", action="store_true", help="a quick check of the machinery")
    size.add_argument("--full", action="store_true", help="the longer run")
    parser.add_argument("--hami-source", default=None, help="a HAMi checkout at the pinned commit")
    parser.add_argument("--standin-delay-ms", type=float, default=200.0)
    parser.add_argument("--output", type=Path, default=None, help=f"default {RESULTS}")
    args = parser.parse_args()
    mode = "tiny" if args.tiny else "full" if args.full else "default"
    settings = MODES[mode]
    output = args.output or (Path("/tmp/peer-tiny.json") if args.tiny else RESULTS)
    home = hami_peer.build(args.hami_source)
    owner = Owner()
    profile = owner.sign(envelope(owner), name=DEFAULT_CONFIGMAP_NAME)
    webhook_settings = WebhookSettings(
        owner_public_keys=(owner.public_key,),
        cluster_binding_id=CLUSTER,
        namespace=NAMESPACE,
        bundle_configmap=DEFAULT_CONFIGMAP_NAME,
        gpu_registry_credentials_secret="kamiwaza-pull",
        cpu_registry_credentials_secret="kamiwaza-pull",
        cert_reload_seconds=10.0,
    )
    record = Record(
        output,
        {
            "date": datetime.now(UTC).strftime("%Y-%m-%d"),
            "mode": mode,
            "settings": {
                **{k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
                "standin_delay_ms": args.standin_delay_ms,
            },
            "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
            "python": platform.python_version(),
            "kubernetes": versions().kubernetes,
            "hami_commit": (home / "COMMIT").read_text().strip(),
            "hami_configs": {c.system: c.what for c in hami_peer.CONFIGS},
            "load_average_1m": {"before": round(os.getloadavg()[0], 2)},
            "fleet": {"h100x8": H100_NODES, "l40s_48gb": L40S_NODES},
            "pod_create_samples_ms": {},
            "burst": {},
            "steady": {},
        },
    )
    record.phase("setup")
    plane = ControlPlane.start(
        start_scheduler=False, apiserver_args=(*APISERVER_ARGS, *policy_args(audited_users()))
    )
    hamis = {config.system: Hami(plane, home, config) for config in hami_peer.CONFIGS}
    standin = DevicePluginStandIn(
        plane, [c.namespace for c in hami_peer.CONFIGS], args.standin_delay_ms / 1000
    )
    servers: list[Any] = []
    try:
        kube = plane.kube("admin")
        create_fake_nodes(kube, fleet())
        with deploy_webhook(plane, webhook_settings, profile) as hook:
            assert hook.process is not None
            hook_pid = hook.process.pid
            grant_extender(plane)
            tmi_port, constant_port = free_port(), free_port()
            extender = start_extender(plane, owner, tmi_port, tls=True)
            constant_extender = start_constant_extender(plane, constant_port, tls=True)
            servers += [extender, constant_extender]
            create_namespaces(plane)
            constant = ConstantWebhook(plane, hook, scheduler_name=CONSTANT_SCHEDULER)
            constant.install()
            # The first to start writes HAMi's node handshake; a fast client does it quickly.
            for name in ("hami-tuned", "hami-spread", "hami-installed"):
                hamis[name].start()
                hamis[name].wait_registered(H100_NODES + L40S_NODES)
            standin.start()
            systems = build_systems(
                plane,
                tmi_url=f"https://127.0.0.1:{tmi_port}",
                tmi_pids={"extender": extender.pid, "webhook": hook_pid},
                webhook_user=plane.user(hook.identity),
                constant_url=f"https://127.0.0.1:{constant_port}",
                constant_pids={
                    "extender": constant_extender.pid,
                    "webhook": constant.process.pid,
                },
                hamis=hamis,
            )
            audit = AuditTail(plane.workdir)
            record.data["load_average_1m"]["after_setup"] = round(os.getloadavg()[0], 2)
            ports = {"tmi": tmi_port, "constant": constant_port}
            ports.update({name: hami.port for name, hami in hamis.items()})
            record.phase("filter")
            record.data["filter_round_trip"] = filter_round_trips(
                plane, systems, ports, settings["filter_calls"], simulate="hami-tuned"
            )
            record.write()
            record.phase("burst")
            race = Race(plane, systems, settings, audit, standin, record)
            run_burst(race)
            record.phase("steady")
            run_steady(race)
            record.phase("end")
            extra = {name: hami.pid for name, hami in hamis.items()}
            extra |= {"tmi-extender": extender.pid, "constant-webhook": constant.process.pid}
            record.data["memory_mib"] = memory(plane, systems, hook_pid, extra)
            record.data["tmi_webhook_reviews"] = hook.reviews()
            constant.stop()
    finally:
        standin.stop()
        for hami in hamis.values():
            hami.stop()
        for server in servers:
            if server.poll() is None:
                server.terminate()
        plane.stop()
    record.data["device_plugin_stand_in"] = {
        "delay_ms": args.standin_delay_ms,
        "locks_released": standin.released,
        "lock_not_its_pods": standin.not_ours,
        "errors": standin.errors[:10],
    }
    record.write()
    print(json.dumps(record.data.get("summary", {}), indent=2))


if __name__ == "__main__":
    main()
