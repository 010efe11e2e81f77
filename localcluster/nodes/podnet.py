"""The real node's Pod network: one Linux bridge with host-local addresses, routed by the host.

A Pod on the real node gets an address on ``bridge`` from ``subnet`` (the CNI bridge plugin with
host-local IPAM); the host holds ``gateway`` on the same bridge. The API server, which must reach
the webhook's Pod and be reached by Pods, binds every address and advertises ``gateway`` as its
endpoint behind the ``kubernetes`` Service; kube-proxy turns Service ClusterIPs from
``service_cidr`` into those endpoints. Nothing here touches the machine's own interfaces: the
bridge is the project's, made before the node starts and removed after it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import subprocess
from dataclasses import dataclass
from pathlib import Path

SYSCTLS = {
    # The host routes between the bridge and itself; kube-proxy's DNAT must see bridged traffic
    # too, or a Pod calling a Service that lands on a Pod of the same bridge gets no answer.
    "net/ipv4/ip_forward": "1",
    "net/bridge/bridge-nf-call-iptables": "1",
}


class PodNetworkError(RuntimeError):
    """The bridge could not be set up; the message has the command's output."""


@dataclass(frozen=True)
class PodNetwork:
    """Addresses of the real node's Pods and Services."""

    bridge: str = "tmi-cni0"
    subnet: str = "10.88.0.0/24"
    service_cidr: str = "10.96.0.0/24"
    cluster_domain: str = "cluster.local"

    @property
    def gateway(self) -> str:
        return str(next(ipaddress.ip_network(self.subnet).hosts()))

    @property
    def kubernetes_service_ip(self) -> str:
        return str(next(ipaddress.ip_network(self.service_cidr).hosts()))

    def apiserver_hosts(self) -> tuple[str, ...]:
        """What the API server's certificate must name for Pods to trust it."""
        names = ("kubernetes", "kubernetes.default", "kubernetes.default.svc")
        return (
            self.gateway,
            self.kubernetes_service_ip,
            *names,
            f"kubernetes.default.svc.{self.cluster_domain}",
        )

    def cni_config(self) -> dict[str, object]:
        """The conflist the CNI plugins run from (bridge, host-local, portmap, loopback)."""
        return {
            "cniVersion": "1.0.0",
            "name": "tmi",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.subnet, "gateway": self.gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def up(self) -> None:
        """Make the bridge with the gateway address (idempotent) and the host's forwarding on."""
        if not _exists(self.bridge):
            _ip("link", "add", self.bridge, "type", "bridge")
        addresses = _ip("-o", "addr", "show", "dev", self.bridge)
        prefix = ipaddress.ip_network(self.subnet).prefixlen
        if f" {self.gateway}/" not in addresses:
            _ip("addr", "add", f"{self.gateway}/{prefix}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for key, value in SYSCTLS.items():
            path = Path("/proc/sys") / key
            if not path.exists():
                raise PodNetworkError(f"{path} is missing: the kernel lacks {key.split('/')[1]}")
            path.write_text(value)

    def down(self) -> None:
        """Remove the bridge (and with it the routes to the Pods)."""
        if _exists(self.bridge):
            with contextlib.suppress(PodNetworkError):
                _ip("link", "delete", self.bridge)


def _exists(device: str) -> bool:
    return Path("/sys/class/net", device).exists()


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PodNetworkError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout
