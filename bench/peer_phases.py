"""The burst and the steady arrivals of `bench_peer.py`: the fleet and the seeded streams of
engine Pods both use, and how each phase runs every system over them (the measuring itself is
`peer_measure.py`'s and `peer_arrival.py`'s). The module docstring of `bench_peer.py` says what
is compared and why it is fair; the docstrings here say how each phase keeps it so.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

import hami_peer
from hami_peer import Card
from hami_standin import DevicePluginStandIn
from peer_arrival import Window, paced_window
from peer_audit import AuditTail
from peer_measure import clear, clear_locks, schedule_run, stranded
from peer_report import Record
from peer_systems import Item, System
from scheduling_run import SCHEDULER_ARGS

from kits.fleetkit import h100, l40s
from localcluster import ControlPlane

H100_NODES = 16
L40S_NODES = 32
H100 = Card("NVIDIA H100 80GB HBM3", 81559)
L40S = Card("NVIDIA L40S", 48 * 1024)
# (kind, GPUs, share GB, how many) of each stream. "fits": 88 of the 128 whole GPUs and 800 of
# the 1,536 GB of shares, so every Pod binds. "overfull" (`--full`): 160 GPUs of whole Pods and
# 1,440 GB of shares, more than the fleet holds, so packing decides how many are placed.
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


@dataclass(frozen=True)
class Race:
    """What every phase runs over: the plane, the systems side by side, the mode's settings,
    the audit log's tail, the device plugin's stand-in and the record written as it goes."""

    plane: ControlPlane
    systems: dict[str, System]
    settings: dict[str, Any]
    audit: AuditTail
    standin: DevicePluginStandIn
    record: Record


# The systems that schedule in the burst; the floors' Pods are created there for the create
# latency only.
BURST = ("tmi", *(config.system for config in hami_peer.CONFIGS))


def arrivals(stream: str, seed: int) -> list[Item]:
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


def create_stream(
    kube: Any, systems: dict[str, System], items: list[Item], prefix: str
) -> tuple[dict[str, list[float]], list[str]]:
    """Create the stream's Pods one at a time, in each system's namespace in turn, the order
    rotating; each create's latency by system, and the Pods' names."""
    latency: dict[str, list[float]] = {name: [] for name in systems}
    names = []
    order = list(systems.values())
    for index, item in enumerate(items):
        name = f"{prefix}-{item[0]}-{index:03d}"
        names.append(name)
        shift = index % len(order)
        for system in order[shift:] + order[:shift]:
            body = system.build(name, item)
            start = time.perf_counter()
            stored = kube.create(body)
            latency[system.name].append(time.perf_counter() - start)
            if not system.admitted(stored):
                raise SystemExit(f"{system.name}'s Pod {name} was not admitted as expected")
    return latency, names


def quiet(audit: AuditTail, system: System, seconds: float = 1.0, limit: float = 30.0) -> float:
    """Wait until `system`'s path has made no request for `seconds` (HAMi's Events and lock
    calls of its last run, queued behind its client's rate limit, finish first), at most
    `limit`; how long it waited."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if time.time() - audit.last_request(system.users - {system.scheduler_user}) > seconds:
            break
        time.sleep(0.25)
    return round(time.monotonic() - start, 2)


def run_burst(race: Race) -> None:
    kube = race.plane.kube("admin")
    data = race.record.data
    for repeat in range(race.settings["repeats"]):
        for stream in race.settings["streams"]:
            items = arrivals(stream, repeat)
            if race.settings["burst_pods"] and stream == "fits":
                items = items[: race.settings["burst_pods"]]
            latency, names = create_stream(kube, race.systems, items, f"{stream[0]}{repeat}")
            for name, values in latency.items():
                data["pod_create_samples_ms"].setdefault(name, [])
                data["pod_create_samples_ms"][name] += [round(v * 1000, 2) for v in values]
            # The floors' Pods were for the create latency only: gone before any scheduling.
            clear(kube, [race.systems["constant"].namespace, race.systems["none"].namespace])
            shift = repeat % len(BURST)
            for name in BURST[shift:] + BURST[:shift]:
                system = race.systems[name]
                waited = quiet(race.audit, system) if name.startswith("hami") else 0.0
                label = f"burst-{name}-{stream}-{repeat}"
                run = schedule_run(
                    race.plane, system, label, names, race.audit, race.settings["burst_timeout_s"]
                )
                run["waited_for_quiet_s"] = waited
                race.standin.idle()
                run["packing"] = stranded(kube, name, system.namespace, items, names, fleet())
                clear(kube, [system.namespace])
                run["locks_left"] = clear_locks(kube)
                data["burst"].setdefault(stream, {}).setdefault(name, []).append(run)
                print(f"{label}: {json.dumps(run)[:240]}", file=sys.stderr)
                race.record.write()


def run_steady(race: Race) -> None:
    """Every system's kube-scheduler running; at each rate, `tmi`, the constant pair and no
    extender in slices taken in turn (ABC CBA ...), so the machine's load, which moves within
    seconds here, falls on the three alike; then each HAMi configuration in one window (its
    queue builds across the whole window, and a slice would cut it). The two blocks' order
    alternates between rates."""
    data = race.record.data
    for system in race.systems.values():
        race.plane.start_scheduler(
            system.config,
            name=f"steady-{system.name}",
            identity=system.scheduler_identity,
            verbosity=system.verbosity,
            extra_args=SCHEDULER_ARGS,
        )
    for index, rate in enumerate(race.settings["rates"]):
        items = arrivals("fits", 100 + index)[: race.settings["pods_per_rate"]]
        blocks = [_trio, _hami_block] if index % 2 == 0 else [_hami_block, _trio]
        for block in blocks:
            windows = block(race, rate, items, index)
            for name, window in windows.items():
                report = window.report()
                data["steady"].setdefault(name, {})[f"{rate:g}"] = report
                shown = {k: report[k] for k in ("bound", "create_to_bound", "load_average_1m")}
                print(f"steady-{name} at {rate:g}/s: {json.dumps(shown)}", file=sys.stderr)
            race.record.write()


TRIO = ("tmi", "constant", "none")


def _trio(race: Race, rate: float, items: list[Item], index: int) -> dict[str, Window]:
    slices = race.settings["slices"]
    size = -(-len(items) // slices)
    windows = {name: Window(rate) for name in TRIO}
    for part in range(slices):
        chunk = items[part * size : (part + 1) * size]
        order = TRIO if (part + index) % 2 == 0 else TRIO[::-1]
        for name in order:
            system = race.systems[name]
            prefix = f"r{rate:g}-{name}-{part}".replace(".", "p")
            windows[name].add(
                paced_window(
                    race.plane,
                    system,
                    f"steady-{name}",
                    chunk,
                    rate,
                    prefix,
                    race.audit,
                    race.settings["drain_s"],
                )
            )
    # Their bound Pods hold GPUs that HAMi's kube-scheduler ignores but theirs count.
    clear(race.plane.kube("admin"), [race.systems[name].namespace for name in TRIO])
    return windows


def _hami_block(race: Race, rate: float, items: list[Item], index: int) -> dict[str, Window]:
    kube = race.plane.kube("admin")
    names = [config.system for config in hami_peer.CONFIGS]
    shift = index % len(names)
    windows = {}
    for name in names[shift:] + names[:shift]:
        system = race.systems[name]
        waited = quiet(race.audit, system)
        prefix = f"r{rate:g}-{name}".replace(".", "p")
        window = paced_window(
            race.plane,
            system,
            f"steady-{name}",
            items,
            rate,
            prefix,
            race.audit,
            race.settings["drain_s"],
        )
        race.standin.idle()
        clear(kube, [system.namespace])
        clear_locks(kube)
        window.loads.append(round(os.getloadavg()[0], 2))
        window.waited = waited
        windows[name] = window
    return windows
