"""Faults for the e2e fault tests: a Service stand-in, component crashes, and the API's record.

The fault tests prove that the stack survives what production does to it: a webhook replica
killed behind its Service, kube-apiserver and etcd restarted under running servers, a controller
replica killed between its read and its write. The local control plane has no kube-proxy and no
kubelet, so what those would provide is played here, as narrowly as possible:

* ``RoundRobinProxy`` stands in for a Service's endpoints: a TCP passthrough on 127.0.0.1 that
  spreads connections over the replicas' ports, one connection at a time, as kube-proxy does. TLS
  is end to end (each replica's certificate names 127.0.0.1), so the API server still verifies
  the replica it reaches. A connection to a replica that is gone fails, as it does until the
  EndpointSlice controller takes the endpoint out; ``remove`` is that update.
* ``restart_etcd`` and ``restart_apiserver`` crash (SIGKILL) or stop a core component and start
  it again with the same command line, on the same ports and data directory, then wait until it
  serves again; the tmi servers are left alone, so what is tested is their own reconnection.
* ``condition_history`` replays a Pod's changes from a resourceVersion through a watch, which is
  the API server's own record of every write, so a test can count the writes of a condition
  rather than infer them from logs.
* ``record_figure`` keeps each test's measured figure in ``.artifacts/faults.json`` for
  RELIABILITY.md.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from localcluster.plane.controlplane import HOST, ControlPlane
from localcluster.plane.kube import JSON, Kube
from localcluster.plane.process import http_ok, wait_until

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / ".artifacts" / "faults.json"
RESTART_TIMEOUT = 120.0
_CHUNK = 64 * 1024


class RoundRobinProxy:
    """A TCP passthrough on 127.0.0.1 in front of several local ports, connection by connection.

    Runs in daemon threads of the test process: one accepting, one per open connection.
    ``connections`` counts the connections handed to each backend port, ``refused`` those whose
    backend could not be reached (the client's connection is then closed, unanswered).
    """

    def __init__(self, backends: Sequence[int], host: str = HOST) -> None:
        if not backends:
            raise ValueError("a proxy needs at least one backend")
        self.host = host
        self.backends = list(backends)
        self.connections: Counter[int] = Counter()
        self.refused: Counter[int] = Counter()
        self._lock = threading.Lock()
        self._next = 0
        self._open: set[socket.socket] = set()
        self._listener = socket.create_server((host, 0))
        self.port: int = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def start(self) -> RoundRobinProxy:
        self._thread.start()
        return self

    def remove(self, port: int) -> None:
        """Take a backend out of rotation (what an EndpointSlice update does for kube-proxy)."""
        with self._lock:
            self.backends.remove(port)

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.close()
            self._open.clear()
        self._thread.join(timeout=5)

    def __enter__(self) -> RoundRobinProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _pick(self) -> int:
        with self._lock:
            port = self.backends[self._next % len(self.backends)]
            self._next += 1
            return port

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        port = self._pick()
        try:
            backend = socket.create_connection((self.host, port), timeout=2)
        except OSError:
            with self._lock:
                self.refused[port] += 1
            client.close()
            return
        with self._lock:
            self.connections[port] += 1
            self._open.update((client, backend))
        try:
            self._pump(client, backend)
        finally:
            with self._lock:
                self._open.difference_update((client, backend))
            for sock in (client, backend):
                with contextlib.suppress(OSError):
                    sock.close()

    def _pump(self, client: socket.socket, backend: socket.socket) -> None:
        backend.settimeout(None)
        peer = {client: backend, backend: client}
        with selectors.DefaultSelector() as selector:
            for sock in peer:
                selector.register(sock, selectors.EVENT_READ)
            while not self._stopped.is_set():
                for key, _ in selector.select(timeout=0.5):
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = source.recv(_CHUNK)
                        if not data:
                            return
                        peer[source].sendall(data)
                    except OSError:
                        # A reset from either side (a replica killed mid-request) ends both.
                        return


# -- core components ------------------------------------------------------------------------------


def wait_apiserver(plane: ControlPlane, timeout: float = RESTART_TIMEOUT) -> float:
    """Until kube-apiserver's /readyz answers 200 (its storage, RBAC and informers included);
    returns the monotonic time it did."""
    context = ssl.create_default_context(cafile=str(plane.ca_file))
    wait_until(
        lambda: http_ok(f"{plane.server}/readyz", context),
        timeout=timeout,
        what="kube-apiserver /readyz",
    )
    return time.monotonic()


def restart_etcd(
    plane: ControlPlane, *, kill: bool = True, timeout: float = RESTART_TIMEOUT
) -> float:
    """Crash (or stop) etcd and start it on the same data directory and ports; returns the
    seconds until the API server was ready again on top of it."""
    started = time.monotonic()
    proc = plane.respawn("etcd", kill=kill)
    wait_until(
        lambda: http_ok(f"{plane.etcd_url}/health"), timeout=timeout, what="etcd /health", proc=proc
    )
    return wait_apiserver(plane, timeout) - started


def restart_apiserver(
    plane: ControlPlane,
    *,
    kill: bool = True,
    down: float = 0.0,
    timeout: float = RESTART_TIMEOUT,
) -> float:
    """Crash (or stop) kube-apiserver, keep it down for ``down`` seconds (an outage long enough
    for clients to back off and leases to lapse), and start it on the same port; returns the
    seconds from the crash until its /readyz answered again."""
    started = time.monotonic()
    plane.respawn("kube-apiserver", kill=kill, delay=down)
    return wait_apiserver(plane, timeout) - started


# -- the API server's record ----------------------------------------------------------------------


def condition_history(
    kube: Kube, namespace: str, name: str, since: str, condition_type: str
) -> list[JSON | None]:
    """The Pod's ``condition_type`` entry after each change since resourceVersion ``since``, in
    order, replayed by a short watch from that version; one element per stored version."""
    query: dict[str, str | int | bool] = {
        "watch": "true",
        "fieldSelector": f"metadata.name={name}",
        "resourceVersion": since,
        "timeoutSeconds": 1,
    }
    answer = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods", query=query)
    text = answer.get("raw")
    lines = text.splitlines() if isinstance(text, str) else [json.dumps(answer)]
    states: list[JSON | None] = []
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        if event["type"] == "ERROR":
            raise RuntimeError(f"the watch from {since} failed: {event['object']}")
        if event["type"] not in ("ADDED", "MODIFIED"):
            continue
        conditions = (event["object"].get("status") or {}).get("conditions") or []
        states.append(next((dict(c) for c in conditions if c["type"] == condition_type), None))
    return states


def writes_of(states: Sequence[JSON | None]) -> int:
    """How many of the versions in ``states`` changed the condition (a write that took)."""
    count, previous = 0, None
    for state in states:
        if state != previous:
            count += 1
        previous = state
    return count


# -- figures --------------------------------------------------------------------------------------


def record_figure(name: str, figure: Mapping[str, Any], path: Path = FIGURES) -> None:
    """Merge one test's figure into the JSON file under ``name`` (the latest run wins)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        figures: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        figures = {}
    figures[name] = {**figure, "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")


__all__ = [
    "FIGURES",
    "RoundRobinProxy",
    "condition_history",
    "record_figure",
    "restart_apiserver",
    "restart_etcd",
    "wait_apiserver",
    "writes_of",
]
