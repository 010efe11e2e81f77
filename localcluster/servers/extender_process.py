"""The extender as a local process of the harness: the owner's Deployment's arguments and
settings, a certificate from the plane's CA, and a port kept across restarts (the scheduler's
configuration names it)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from localcluster.install.install import Rendered
from localcluster.plane.components import HOST
from localcluster.plane.metrics import metric
from localcluster.plane.process import python_module, wait_until
from localcluster.servers.server import LocalServer, blank_tmi

EXTENDER_IDENTITY = "tmi-extender"
EXTENDER_DEPLOYMENT = "tmi-extender"
# What the harness sets itself in place of a Pod's: where to listen and with which certificate.
# The metrics and plan ports are dropped too: local processes share one host, and the harness
# reads each server's /metrics and /v1/plan on its serving port
# (tests/integration/serving/test_serving.py covers the split).
LOCAL_FLAGS = ("--cert", "--key", "--port", "--host", "--metrics-port", "--plan-port")


@dataclass
class LocalExtender(LocalServer):
    """The extender process, run with the arguments and settings of the owner's rendered
    Deployment (``install``) under its ServiceAccount (``identity``)."""

    name: str = "tmi-extender"
    install: Rendered | None = None
    identity: str = EXTENDER_IDENTITY
    _cert: Path | None = None
    _key: Path | None = None

    @property
    def process_name(self) -> str:
        return self.name

    def argv(self) -> list[str]:
        if self._cert is None or self._key is None:
            pair = self.plane.issue_serving_cert(self.name, (HOST,))
            self._cert, self._key = pair.cert_file, pair.key_file
        local = [
            f"--cert={self._cert}",
            f"--key={self._key}",
            f"--host={HOST}",
            f"--port={self.port}",
            f"--kubeconfig={self.plane.kubeconfig(self.identity)}",
        ]
        # Teardown, not a rolling update: nobody needs the drain.
        quick = ["--drain-seconds=0", "--shutdown-timeout=2"]
        assert self.install is not None, "the extender runs from the owner's rendered part"
        shipped = self.install.args(EXTENDER_DEPLOYMENT, replace=LOCAL_FLAGS)
        return [*python_module("extender"), *shipped, *local, *quick]

    def environment(self) -> dict[str, str] | None:
        if self.install is None:
            return None
        return {**blank_tmi(), **self.install.environment(EXTENDER_DEPLOYMENT, self.name)}

    def wait_nodes(self, names: Iterable[str], timeout: float = 30.0) -> None:
        """Until the extender's node cache holds every node the API lists and ``names`` exist.

        Its cache follows a watch; a Pod filtered against a node the cache has not seen yet is
        only retried later, so tests that have just created nodes wait here first.
        """
        wanted = set(names)
        kube = self.plane.kube("admin")

        def synced() -> bool:
            listed = {n["metadata"]["name"] for n in kube.request("GET", "/api/v1/nodes")["items"]}
            if not wanted <= listed:
                return False
            return metric(self.metrics(), "tmi_extender_nodes") == len(listed)

        wait_until(synced, timeout=timeout, what=f"the extender to see nodes {sorted(wanted)}")


__all__ = ["EXTENDER_DEPLOYMENT", "EXTENDER_IDENTITY", "LOCAL_FLAGS", "LocalExtender"]
