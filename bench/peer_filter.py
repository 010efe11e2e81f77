"""Each extender's filter round trip, timed directly on the same ExtenderArgs.

kube-scheduler's "algorithm time" holds different work for each system (HAMi's Filter writes
the chosen devices to the Pod and records an Event; `tmi`'s writes nothing), so here each
extender is called as kube-scheduler calls it, over HTTPS with a kept-alive connection, with
the same node names (every node of the fleet) and an equivalent pending Pod of each kind (one
whole H100, one 8 GB share) created through its own webhook. The calls go round the systems one
at a time, so a slow second falls on all of them. HAMi's figure includes the synchronous PATCH
of the Pod and the Event its Filter makes (through its client's rate limiter, which is what its
chart installs); `tmi`'s prioritize, the second call of its cycle, is timed beside its filter;
and HAMi's side-effect-free path (`filterSimulation`, taken when the arguments carry whole Node
objects instead of names) is timed once as the compute alone, decoding the nodes included.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import Mapping, Sequence
from typing import Any

from peer_arrival import percentiles
from peer_systems import Item, System

from localcluster import ControlPlane

KINDS: dict[str, Item] = {"whole": ("whole", 1, 0), "share": ("share", 1, 8)}


class _Client:
    """One kept-alive HTTPS connection to an extender, verified against the plane's CA."""

    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        self.connection = http.client.HTTPSConnection("127.0.0.1", port, context=context)

    def post(self, path: str, body: bytes) -> tuple[float, Any]:
        start = time.perf_counter()
        self.connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = self.connection.getresponse()
        data = response.read()
        elapsed = time.perf_counter() - start
        if response.status != 200:
            raise RuntimeError(f"{path}: {response.status} {data[:300]!r}")
        return elapsed, json.loads(data)

    def close(self) -> None:
        self.connection.close()


def filter_round_trips(
    plane: ControlPlane,
    systems: Mapping[str, System],
    ports: Mapping[str, int],
    calls: int,
    simulate: str | None = None,
) -> dict[str, Any]:
    """`calls` filter calls per system in `ports` and kind, round robin; the module docstring
    says what else is timed. The Pods are created here and deleted afterwards."""
    kube = plane.kube("admin")
    context = ssl.create_default_context(cafile=str(plane.ca_file))
    nodes = kube.request("GET", "/api/v1/nodes")["items"]
    names = sorted(node["metadata"]["name"] for node in nodes)
    bodies: dict[tuple[str, str], bytes] = {}
    for system_name in ports:
        system = systems[system_name]
        for kind, item in KINDS.items():
            stored = kube.create(system.build(f"filter-{kind}", item))
            bodies[(system_name, kind)] = json.dumps({"Pod": stored, "NodeNames": names}).encode()
    clients = {name: _Client(port, context) for name, port in ports.items()}
    times: dict[str, list[float]] = {f"{s} {k}": [] for s in ports for k in KINDS}
    prioritize: dict[str, list[float]] = {f"tmi {k}": [] for k in KINDS}
    kept: dict[str, int] = {}
    order = list(ports)
    try:
        for index in range(calls):
            shift = index % len(order)
            for system_name in order[shift:] + order[:shift]:
                for kind in KINDS:
                    body = bodies[(system_name, kind)]
                    elapsed, answer = clients[system_name].post("/filter", body)
                    times[f"{system_name} {kind}"].append(elapsed)
                    kept[f"{system_name} {kind}"] = len(answer.get("NodeNames") or [])
                    if system_name == "tmi":
                        elapsed, _ = clients["tmi"].post("/prioritize", body)
                        prioritize[f"tmi {kind}"].append(elapsed)
        out: dict[str, Any] = {
            "calls": calls,
            "node_names_sent": len(names),
            "filter": {key: percentiles(values) for key, values in times.items()},
            "nodes_kept": kept,
            "tmi_prioritize": {key: percentiles(values) for key, values in prioritize.items()},
        }
        if simulate is not None:
            out["hami_compute_only"] = _simulation(
                clients[simulate], bodies, simulate, nodes, calls
            )
            out["hami_compute_only"]["system"] = simulate
    finally:
        for client in clients.values():
            client.close()
        for system_name in ports:
            namespace = systems[system_name].namespace
            for kind in KINDS:
                kube.request(
                    "DELETE",
                    f"/api/v1/namespaces/{namespace}/pods/filter-{kind}",
                    query={"gracePeriodSeconds": 0},
                )
    return out


def _simulation(
    client: _Client,
    bodies: Mapping[tuple[str, str], bytes],
    system: str,
    nodes: Sequence[Any],
    calls: int,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in KINDS:
        args = json.loads(bodies[(system, kind)])
        args.pop("NodeNames")
        args["Nodes"] = {"items": list(nodes)}
        body = json.dumps(args).encode()
        out[kind] = percentiles([client.post("/filter", body)[0] for _ in range(calls)])
        out["body_kib"] = round(len(body) / 1024, 1)
    return out


__all__ = ["filter_round_trips"]
