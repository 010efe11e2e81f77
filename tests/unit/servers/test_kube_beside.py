"""A process serving several tenant namespaces has one API port per namespace over one
connection pool (`HttpKube.beside`), so N tenants cost one pool, not N."""

from __future__ import annotations

from pathlib import Path

from allocation_controller.kubeapi import HttpKube
from tests.unit.servers.test_kube_auth import KUBECONFIG


async def test_a_port_beside_shares_the_pool_and_credentials_but_not_the_namespace(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    first = HttpKube.from_kubeconfig(str(path), "team-a", lease_namespace="tmi-system")
    second = first.beside("team-b")
    third = second.beside("team-c")
    assert [p.namespace for p in (first, second, third)] == ["team-a", "team-b", "team-c"]
    assert second._authorization() == "Bearer s3cret-token"
    assert second._path("pods", "p") == "/api/v1/namespaces/team-b/pods/p"
    # The Lease is the process's one, wherever the port.
    assert second._lease("l") == first._lease("l")
    assert "/namespaces/tmi-system/leases/l" in second._lease("l")
    session = first.session
    assert second.session is session and third.session is session
    # Closing a port beside leaves the pool to the first; closing the first closes it.
    await second.close()
    assert not session.closed
    await first.close()
    assert session.closed
